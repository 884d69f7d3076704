// `attest convert --to FORMAT [--rounding rne|rz|ru|rd|rna] [--saturate] [--nan keep|drop]
// --in F --out F` (docs/design.md "CLI contract"): every float tensor of a safetensors file
// converted to one element format (reference/formats/format.h, docs/formats.md), same names,
// stored in the format's safetensors dtype (BF16 F16 F8_E4M3 F8_E5M2 F8_E8M0, F32, F64) or
// as U8 codes, one per byte, for e3m2fn / e2m3fn / e2m1fn. Integer tensors are copied
// unchanged. Bad options, unreadable or malformed input, or an unwritable output exit 2.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <string>

#include "reference/formats/format.h"
#include "reference/io/safetensors.h"
#include "tools/attest/command.h"

namespace attest::cli {
namespace {

struct ConvertOptions {
  std::string to;
  std::string rounding = "rne";
  bool saturate = false;
  std::string nan = "keep";
  std::string in;
  std::string out;
  bool quiet = false;
};

int RunConvert(const ConvertOptions& opt) {
  const auto format = ParseFormat(opt.to);
  if (!format) {
    throw UsageError("--to: unknown format '" + opt.to +
                     "' (expected f64 f32 bf16 f16 e4m3fn e5m2 e3m2fn e2m3fn e2m1fn e8m0fnu)");
  }
  const auto rounding = ParseRounding(opt.rounding);
  if (!rounding || *rounding == Rounding::kStochastic) {
    throw UsageError("--rounding: expected rne, rz, ru, rd or rna, got '" + opt.rounding + "'");
  }
  EncodeOptions options;
  options.rounding = *rounding;
  options.overflow = opt.saturate ? Overflow::kSaturate : Overflow::kDefault;
  options.nan = opt.nan == "drop" ? NanPolicy::kDropSign : NanPolicy::kKeepSign;

  auto input = ReadSafetensors(opt.in);
  if (!input.ok()) throw UsageError(input.error().message);

  NamedTensors output;
  output.metadata = input->metadata;
  output.metadata["attest.convert"] =
      fmt::format("to={} rounding={} saturate={} nan={}", Name(*format), Name(*rounding),
                  opt.saturate ? "yes" : "no", opt.nan);
  for (const auto& [name, tensor] : input->tensors) {
    if (!Info(tensor.dtype()).is_float) {
      if (!opt.quiet) {
        std::cerr << fmt::format("{}: {} is {}, not a float tensor: copied unchanged\n", opt.in,
                                 name, Name(tensor.dtype()));
      }
      output.Add(name, tensor);
      continue;
    }
    ConversionStats stats;
    auto converted = Convert(tensor, *format, options, &stats);
    if (!converted.ok())
      throw UsageError(opt.in + ": tensor " + name + ": " + converted.error().message);
    if (!opt.quiet) {
      std::cout << fmt::format(
          "{} {} -> {} ({}): {} elements, {} inexact, {} overflow, {} underflow, {} invalid\n",
          name, Name(tensor.dtype()), Name(*format), Name(converted->dtype()), stats.elements,
          stats.inexact, stats.overflow, stats.underflow, stats.invalid);
    }
    output.Add(name, std::move(converted).value());
  }
  const Status written = WriteSafetensors(opt.out, output);
  if (!written.ok()) throw UsageError(written.error().message);
  return kExitPass;
}

Runner SetupConvert(CLI::App& sub) {
  auto opt = std::make_shared<ConvertOptions>();
  sub.add_option("--to", opt->to,
                 "Target format: f64 f32 bf16 f16 e4m3fn e5m2 e3m2fn e2m3fn e2m1fn e8m0fnu "
                 "(fp6/fp4 are written as U8 codes, one per byte)")
      ->required();
  sub.add_option("--rounding", opt->rounding, "Rounding: rne (default), rz, ru, rd, rna")
      ->check(CLI::IsMember({"rne", "rz", "ru", "rd", "rna"}));
  sub.add_flag("--saturate", opt->saturate,
               "Overflow and Inf saturate to the largest finite value (default: Inf where the "
               "format has it, else NaN, else saturate)");
  sub.add_option("--nan", opt->nan, "NaN sign: keep (default) or drop")
      ->check(CLI::IsMember({"keep", "drop"}));
  sub.add_option("--in", opt->in, "Input safetensors file")->required();
  sub.add_option("--out", opt->out, "Output safetensors file")->required();
  sub.add_flag("--quiet", opt->quiet, "Do not print per-tensor statistics");
  return [opt] { return RunConvert(*opt); };
}

}  // namespace

ATTEST_COMMAND("convert", "Convert the float tensors of a safetensors file to a number format", 60,
               SetupConvert);

}  // namespace attest::cli
