// `attest oracle --case F.case.json --out F.safetensors [--precision double|mp128|mp256]
// [--threads N] [--device cpu|cuda]` (docs/design.md "CLI contract"): runs the oracle
// (reference/oracle/oracle.h; with --device cuda the float64 oracle on a GPU,
// reference/oracle/cuda/oracle_cuda_host.h, which exits 2 with a message where there is no
// library or GPU) on a case's inputs (reference/case/inputs.h: loaded or generated, rounded
// to the dtype) and writes o, lse, dq, dk, dv and delta (and dsink / drel_bias when the
// problem has a learnable sink / relative bias) as F64 (forward outputs only when the case
// has no "do"); the CUDA oracle declines sinks and relative biases, so such a case runs on
// the CPU oracle with --device cuda too. The file's metadata records the precision, the
// OracleStats and each tensor's certification bound (ErrorBound). A missing or invalid case
// file, inputs that do not match the problem, or an unwritable output exit 2.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "reference/case/case_file.h"
#include "reference/case/inputs.h"
#include "reference/io/safetensors.h"
#include "reference/oracle/cuda/oracle_cuda_host.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_gemm.h"
#include "tools/attest/command.h"

namespace attest::cli {
namespace {

struct OracleCmdOptions {
  std::string case_path;
  std::string out;
  std::string precision = "double";
  int threads = 0;
  std::string device = "cpu";
  bool quiet = false;
};

nlohmann::json StatsJson(const OracleStats& s) {
  return {{"unit_roundoff", s.unit_roundoff},
          {"scale", s.scale},
          {"softcap", s.softcap},
          {"head_dim", s.head_dim},
          {"head_dim_v", s.head_dim_v},
          {"score_abs_max", s.score_abs_max},
          {"v_abs_max", s.v_abs_max},
          {"v_norm_max", s.v_norm_max},
          {"k_abs_max", s.k_abs_max},
          {"lse_abs_max", s.lse_abs_max},
          {"max_keys", s.max_keys},
          {"sum_len_k", s.sum_len_k},
          {"empty_rows", s.empty_rows},
          {"q_abs_max", s.q_abs_max},
          {"do_abs_max", s.do_abs_max},
          {"do_norm_max", s.do_norm_max},
          {"col_mass_max", s.col_mass_max},
          {"max_queries", s.max_queries},
          {"sum_len_q", s.sum_len_q},
          {"unseen_keys", s.unseen_keys}};
}

// The sink's statistics join the metadata only for a problem with a sink (files of other
// problems keep their bytes).
void AddSinkStats(nlohmann::json& j, const OracleStats& s) {
  j["sink_abs_max"] = s.sink_abs_max;
  j["sink_mass_max"] = s.sink_mass_max;
  j["sink_rows"] = s.sink_rows;
}

// Likewise the relative bias's, only for a problem with one.
void AddRelBiasStats(nlohmann::json& j, const OracleStats& s) {
  j["rel_bias_abs_max"] = s.rel_bias_abs_max;
  j["rel_bias_mass_max"] = s.rel_bias_mass_max;
  j["rel_bias_terms"] = s.rel_bias_terms;
}

int RunOracle(const OracleCmdOptions& opt) {
  const auto precision = ParsePrecision(opt.precision);
  if (!precision) {
    throw UsageError("--precision: expected double, mp128 or mp256, got '" + opt.precision + "'");
  }
  if (opt.device != "cpu" && opt.device != "cuda") {
    throw UsageError("--device: expected cpu or cuda, got '" + opt.device + "'");
  }
  const bool cuda = opt.device == "cuda";
  if (cuda && *precision != Precision::kDouble) {
    throw UsageError("--device cuda: only --precision double runs on the GPU");
  }
  auto c = LoadCase(opt.case_path);
  if (!c.ok()) throw UsageError(c.error().message);
  auto in = MakeCaseInputs(*c);
  if (!in.ok()) throw UsageError(opt.case_path + ": " + in.error().message);

  OracleOptions options;
  options.threads = opt.threads;
  if (in->sink.defined()) options.sink = &in->sink;
  if (in->rel_bias.defined()) options.rel_bias = &in->rel_bias;
  // The CUDA oracle declines learnable sinks and relative biases
  // (reference/oracle/cuda/oracle_cuda_host.h): the CPU float64 oracle runs such a case, and
  // says so.
  const bool on_gpu = cuda && !c->problem.sink && !c->problem.rel_bias;
  if (cuda && !on_gpu && !opt.quiet) {
    std::cerr << opt.case_path
              << (c->problem.sink ? ": problem.sink: the CUDA oracle declines learnable sinks"
                                  : ": problem.rel_bias: the CUDA oracle declines learnable "
                                    "relative biases")
              << "; running the CPU float64 oracle\n";
  }
  NamedTensors out;
  nlohmann::json bounds = nlohmann::json::object();
  OracleStats stats;
  std::vector<OracleTensor> tensors;
  try {
    if (in->dout.defined()) {
      BackwardOut b =
          on_gpu ? CudaBackward(c->problem, in->q, in->k, in->v, in->dout)
               : Backward(*precision, c->problem, in->q, in->k, in->v, in->dout, options);
      out.Add("o", b.o);
      out.Add("lse", b.lse);
      out.Add("dq", b.dq);
      out.Add("dk", b.dk);
      out.Add("dv", b.dv);
      out.Add("delta", b.delta);
      stats = b.stats;
      tensors = {OracleTensor::kO,  OracleTensor::kLse, OracleTensor::kDq,
                 OracleTensor::kDk, OracleTensor::kDv,  OracleTensor::kDelta};
      if (b.dsink.defined()) {
        out.Add("dsink", b.dsink);
        tensors.push_back(OracleTensor::kDsink);
      }
      if (b.drel_bias.defined()) {
        out.Add("drel_bias", b.drel_bias);
        tensors.push_back(OracleTensor::kDrelBias);
      }
    } else {
      ForwardOut f = on_gpu ? CudaForward(c->problem, in->q, in->k, in->v)
                          : Forward(*precision, c->problem, in->q, in->k, in->v, options);
      out.Add("o", f.o);
      out.Add("lse", f.lse);
      stats = f.stats;
      tensors = {OracleTensor::kO, OracleTensor::kLse};
      if (!opt.quiet) {
        std::cerr << opt.case_path << ": no 'do' among the inputs: forward outputs only\n";
      }
    }
  } catch (const std::invalid_argument& e) {
    throw UsageError(opt.case_path + ": " + e.what());
  } catch (const std::runtime_error& e) {
    if (!cuda) throw;
    throw UsageError(std::string("--device cuda: ") + e.what());  // no library, no GPU
  }
  for (OracleTensor t : tensors) bounds[std::string(Name(t))] = ErrorBound(stats, t);
  out.metadata["attest.oracle.precision"] = std::string(Name(*precision));
  if (on_gpu) out.metadata["attest.oracle.device"] = "cuda";  // CPU files stay byte-identical
  nlohmann::json stats_json = StatsJson(stats);
  if (c->problem.sink) AddSinkStats(stats_json, stats);
  if (c->problem.rel_bias) AddRelBiasStats(stats_json, stats);
  out.metadata["attest.oracle.stats"] = stats_json.dump();
  out.metadata["attest.oracle.error_bound"] = bounds.dump();
  if (Status s = WriteSafetensors(opt.out, out); !s.ok()) throw UsageError(s.error().message);
  if (!opt.quiet) {
    // The products' ISA version is printed, never stored: every version gives the same bits.
    const std::string how =
        on_gpu ? std::string("double oracle (CUDA)")
        : *precision == Precision::kDouble
            ? fmt::format("double oracle ({} products)", oracle_internal::GemmPanelsIsa())
            : fmt::format("{} oracle", Name(*precision));
    std::cout << fmt::format("{}: {} -> {} ({} empty rows, {} unseen keys)\n", opt.case_path, how,
                             opt.out, stats.empty_rows, stats.unseen_keys);
  }
  return kExitPass;
}

Runner SetupOracle(CLI::App& sub) {
  auto opt = std::make_shared<OracleCmdOptions>();
  sub.add_option("--case", opt->case_path, "Case file (*.case.json)")->required();
  sub.add_option("--out", opt->out,
                 "Output safetensors file (o, lse, dq, dk, dv, delta [, dsink, drel_bias] "
                 "as F64)")
      ->required();
  sub.add_option("--precision", opt->precision, "double (tiled float64), mp128 or mp256 (MPFR)");
  AddIntegerOption(sub, "--threads", opt->threads, 0, 4096, "Worker threads (0: all cores)");
  sub.add_option("--device", opt->device,
                 "cpu, or cuda: the float64 oracle on a GPU (libattest_oracle_cuda.so)");
  sub.add_flag("--quiet", opt->quiet, "Print nothing on success");
  return [opt] { return RunOracle(*opt); };
}

}  // namespace

ATTEST_COMMAND("oracle", "Compute the reference outputs of a case (float64 or multiprecision)", 60,
               SetupOracle);

}  // namespace attest::cli
