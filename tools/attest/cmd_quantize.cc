// `attest quantize --scheme S [--scale-mode floor|ceil|rceil|even] [--axis A] --in F --out F`
// (docs/design.md "CLI contract"; reference/formats/quantize.h, docs/formats.md "Block
// quantizers"): every float tensor NAME of a safetensors file is quantized with one scheme and
// written as NAME (element codes: F8_E4M3 / F8_E5M2, or U8 one code per byte for fp6/fp4),
// NAME.scale (F8_E8M0 for MX, F8_E4M3 for NVFP4, F32 descales for FP8), NAME.dequant (F64 by
// default, or F32) and, for nvfp4, NAME.tensor_scale (F32 [1], the decode factor). Integer
// tensors are copied unchanged. Bad options, input or output exit 2.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "reference/formats/format.h"
#include "reference/formats/quantize.h"
#include "reference/io/safetensors.h"
#include "tools/attest/command.h"

namespace attest::cli {
namespace {

struct QuantizeOptions {
  std::string scheme;
  std::string scale_mode;  // empty: the scheme's default
  int64_t axis = -1;
  int64_t block_size = 0;  // 0: the scheme's default
  std::string nan = "propagate";
  std::string nvfp4_variant = "te";
  std::string dequant_dtype = "f64";
  std::string in;
  std::string out;
  bool quiet = false;
};

std::string SchemeNames() {
  std::string names;
  for (const Scheme& s : AllSchemes()) names += (names.empty() ? "" : " ") + std::string(s.name);
  return names;
}

int RunQuantize(const QuantizeOptions& opt) {
  SchemeOptions options;
  if (FindScheme(opt.scheme) == nullptr) {
    throw UsageError("--scheme: unknown scheme '" + opt.scheme + "' (expected " + SchemeNames() +
                     ")");
  }
  options.scheme = opt.scheme;
  if (!opt.scale_mode.empty()) options.scale_mode = ParseScaleMode(opt.scale_mode);
  options.axis = opt.axis;
  if (opt.block_size != 0) options.block_size = opt.block_size;
  options.nan = *ParseBlockNanPolicy(opt.nan);
  options.nvfp4_variant = *ParseNvfp4Variant(opt.nvfp4_variant);
  const DType dequant_dtype = opt.dequant_dtype == "f32" ? DType::kF32 : DType::kF64;

  auto input = ReadSafetensors(opt.in);
  if (!input.ok()) throw UsageError(input.error().message);

  NamedTensors output;
  output.metadata = input->metadata;
  for (const auto& [name, tensor] : input->tensors) {
    if (!Info(tensor.dtype()).is_float) {
      if (!opt.quiet) {
        std::cerr << fmt::format("{}: {} is {}, not a float tensor: copied unchanged\n", opt.in,
                                 name, Name(tensor.dtype()));
      }
      output.Add(name, tensor);
      continue;
    }
    auto q = Quantize(tensor, options);
    if (!q.ok()) throw UsageError(opt.in + ": tensor " + name + ": " + q.error().message);
    if (!opt.quiet) {
      std::cout << fmt::format("{} {} -> {}: codes {}, scales {}\n", name, tensor.Describe(),
                               q->scheme, q->codes.Describe(), q->scales.Describe());
    }
    Tensor dequant = q->dequant;
    if (dequant_dtype == DType::kF32) {
      auto narrowed = FromF64(dequant, DType::kF32);  // RNE; exact for every MX/FP8 value
      if (!narrowed.ok()) throw UsageError(name + ".dequant: " + narrowed.error().message);
      dequant = std::move(narrowed).value();
    }
    output.Add(name, q->codes);
    output.Add(name + ".scale", q->scales);
    output.Add(name + ".dequant", dequant);
    if (q->tensor_scale.defined()) output.Add(name + ".tensor_scale", q->tensor_scale);
    output.metadata["attest.quantize." + name] = DescribeOptions(*q);
  }
  const Status written = WriteSafetensors(opt.out, output);
  if (!written.ok()) throw UsageError(written.error().message);
  return kExitPass;
}

Runner SetupQuantize(CLI::App& sub) {
  auto opt = std::make_shared<QuantizeOptions>();
  sub.description(
      "Quantize every float tensor NAME of a safetensors file with a block scheme. Writes NAME "
      "(element codes: F8_E4M3/F8_E5M2, or U8 one code per byte for fp6/fp4), NAME.scale "
      "(F8_E8M0 for mxfp*, F8_E4M3 for nvfp4, F32 descales for fp8-*; one per block, the "
      "blocked axis divided by the block size, rounded up), NAME.dequant (the values the codes "
      "and scales represent) and, for nvfp4, NAME.tensor_scale (F32 [1]: dequant = "
      "code * scale * tensor_scale). Inputs are rounded to fp32 first, as the libraries do.");
  sub.add_option("--scheme", opt->scheme, "Scheme: " + SchemeNames())->required();
  sub.add_option("--scale-mode", opt->scale_mode,
                 "MX scale exponent: floor (OCP, default), ceil, rceil (TE/cuDNN), even (torchao)")
      ->check(CLI::IsMember({"floor", "ceil", "rceil", "even"}));
  AddIntegerOption(sub, "--axis", opt->axis, -64, 63,
                   "Axis the blocks run along (default -1, the last)");
  AddIntegerOption(sub, "--block-size", opt->block_size, 1, 2147483647,
                   "Elements per block along --axis (default: the scheme's, 32 MX, 16 NVFP4, "
                   "128 fp8-block)");
  sub.add_option("--nan", opt->nan,
                 "MX blocks holding NaN/Inf: propagate (microxcaling; default), scale (torchao, "
                 "same result), ignore (TransformerEngine fmaxf amax)")
      ->check(CLI::IsMember({"propagate", "scale", "ignore"}));
  sub.add_option("--nvfp4-variant", opt->nvfp4_variant, "NVFP4 arithmetic: te (default), torchao")
      ->check(CLI::IsMember({"te", "torchao"}));
  sub.add_option("--dequant-dtype", opt->dequant_dtype, "dtype of NAME.dequant: f64 (default), f32")
      ->check(CLI::IsMember({"f64", "f32"}));
  sub.add_option("--in", opt->in, "Input safetensors file")->required();
  sub.add_option("--out", opt->out, "Output safetensors file")->required();
  sub.add_flag("--quiet", opt->quiet, "Do not print per-tensor lines");
  return [opt] { return RunQuantize(*opt); };
}

}  // namespace

ATTEST_COMMAND("quantize", "Quantize the float tensors of a safetensors file (MX, NVFP4, FP8)", 61,
               SetupQuantize);

}  // namespace attest::cli
