// Tests of the exec protocol (docs/design.md "External kernels"): command-line splitting, the
// NumPy worker against the oracle, forked kernels bitwise equal to in-process ones, and
// isolation: every way a worker can fail (crash, abort, exit mid-call, hang, garbage,
// missing or misshapen outputs, early exit) becomes an Error naming what happened, and the
// next call succeeds on a fresh worker.
#include "kernels/exec/exec_kernel.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "kernels/exec/process.h"
#include "kernels/no_lse_test_kernel.h"
#include "reference/case/inputs.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"

namespace attest {
namespace {

namespace fs = std::filesystem;

std::string Python() { return ATTEST_PYTHON; }

bool HaveNumpy() {
  static const bool have =
      std::system(fmt::format("'{}' -c 'import numpy' 2>/dev/null", Python()).c_str()) == 0;
  return have;
}

#define REQUIRE_NUMPY()                                                          \
  do {                                                                           \
    if (!HaveNumpy()) GTEST_SKIP() << Python() << " cannot import numpy";         \
  } while (0)

std::string Worker(const std::string& script_and_args) {
  return fmt::format("'{}' {}/tools/workers/{}", Python(), ATTEST_SOURCE_DIR, script_and_args);
}

struct Inputs {
  Problem p;
  Tensor q, k, v, dout;            // in the problem's dtype
  Tensor q64, k64, v64, dout64;    // the same values in f64
};

Inputs MakeInputs(const Problem& p, uint64_t seed = 7) {
  Case c;
  c.problem = p;
  c.generator = GeneratorSpec{"gaussian", seed, nlohmann::json::object()};
  auto in = MakeCaseInputs(c);
  EXPECT_TRUE(in.ok()) << (in.ok() ? "" : in.error().message);
  Inputs out;
  out.p = p;
  out.q64 = in->q;
  out.k64 = in->k;
  out.v64 = in->v;
  out.dout64 = in->dout;
  out.q = *FromF64(in->q, p.dtype);
  out.k = *FromF64(in->k, p.dtype);
  out.v = *FromF64(in->v, p.dtype);
  out.dout = *FromF64(in->dout, p.dtype);
  return out;
}

Problem SmallProblem(int64_t sq = 8, int64_t sk = 8) {
  Problem p;
  p.batch = 1;
  p.heads_q = 2;
  p.heads_kv = 1;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = 16;
  p.head_dim_v = 16;
  p.dtype = DType::kBF16;
  p.causal = true;
  return p;
}

// max |a - b| / max(max |b|, tiny), -inf/+inf/NaN compared as equal only to themselves.
double RelErr(const Tensor& a, const Tensor& b) {
  const Tensor x = ToF64(a), y = ToF64(b);
  EXPECT_EQ(x.shape(), y.shape());
  double err = 0, ref = 1e-30;
  auto xs = x.span<double>(), ys = y.span<double>();
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!std::isfinite(ys[i]) || !std::isfinite(xs[i])) {
      if (!(xs[i] == ys[i])) return INFINITY;
      continue;
    }
    err = std::max(err, std::abs(xs[i] - ys[i]));
    ref = std::max(ref, std::abs(ys[i]));
  }
  return err / ref;
}

template <class T>
std::string AnswerError(const KernelAnswer<T>& a) {
  if (const auto* e = std::get_if<Error>(&a)) return e->message;
  if (const auto* u = std::get_if<Unsupported>(&a)) return "unsupported: " + u->reason;
  return "";
}

// ---- Command lines and stderr tails ----

TEST(SplitCommandLine, QuotesEscapesAndAssignments) {
  auto c = SplitCommandLine(R"(A=1 B_2='x y' python3 'a b.py' "c \"d\"" e\ f --k=v)");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->env, (std::vector<std::string>{"A=1", "B_2=x y"}));
  EXPECT_EQ(c->argv, (std::vector<std::string>{"python3", "a b.py", "c \"d\"", "e f", "--k=v"}));
  EXPECT_FALSE(SplitCommandLine("python3 'open").ok());
  EXPECT_FALSE(SplitCommandLine("python3 \"open").ok());
  EXPECT_FALSE(SplitCommandLine("  ").ok());
  EXPECT_FALSE(SplitCommandLine("X=1").ok());  // assignments but no command
}

TEST(StderrTail, KeepsTheLastLines) {
  StderrTail tail(2);
  const std::string text = "one\ntwo\n\nthree\nfour";
  tail.Append(text.data(), text.size());
  EXPECT_EQ(tail.Joined(), "two | three | four");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV (11)");
}

// ---- The NumPy worker against the oracle ----

struct SemanticsCase {
  const char* what;
  Problem p;
};

std::vector<SemanticsCase> SemanticsCases() {
  std::vector<SemanticsCase> out;
  Problem p = SmallProblem(24, 40);
  p.heads_q = 4;
  p.heads_kv = 2;
  p.head_dim_v = 8;
  p.softcap = 5;
  p.alibi_slopes = std::vector<double>{0.5, 0.25, 0.125, 0.0625};
  out.push_back({"causal gqa softcap alibi Dv!=D", p});
  p = SmallProblem(40, 24);  // Sq > Sk: the top rows see nothing (empty rows)
  p.dtype = DType::kF16;
  out.push_back({"causal Sq>Sk empty rows f16", p});
  p = SmallProblem(20, 33);
  p.causal_align = CausalAlign::kTopLeft;
  p.window_left = 5;
  p.window_right = 0;
  p.dtype = DType::kF32;
  p.alibi_slopes = std::vector<double>{0.3, 0.7};
  out.push_back({"top-left causal window alibi f32", p});
  p = SmallProblem(16, 16);
  p.batch = 3;
  p.causal = false;
  p.window_left = 3;
  p.window_right = 2;
  p.cu_seqlens_q = std::vector<int32_t>{0, 5, 5, 21};  // a zero-length sequence
  p.cu_seqlens_k = std::vector<int32_t>{0, 9, 12, 28};
  out.push_back({"varlen window zero-length", p});
  p = SmallProblem(32, 32);
  p.batch = 2;
  p.prefix_lm = 6;
  p.document_ids_q = std::vector<std::vector<int32_t>>(2, std::vector<int32_t>(32, 0));
  p.document_ids_k = p.document_ids_q;
  for (int i = 20; i < 32; ++i) (*p.document_ids_q)[1][i] = (*p.document_ids_k)[1][i] = 1;
  p.block_sparse = BlockSparse{8, 16, {{0, 0}, {1, 0}, {2, 1}, {3, 0}, {3, 1}}};
  out.push_back({"prefix-lm documents block-sparse", p});
  return out;
}

TEST(NumpyWorker, MatchesTheOracleOnEveryFeature) {
  REQUIRE_NUMPY();
  auto kernel = MakeExecKernel(Worker("numpy_worker.py"));
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  for (const auto& [what, p] : SemanticsCases()) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(Validate(p).ok()) << Validate(p).error().message;
    ASSERT_TRUE((*kernel)->capabilities().Covers(p));
    const Inputs in = MakeInputs(p);
    auto f = (*kernel)->Forward(p, in.q, in.k, in.v);
    ASSERT_TRUE(std::holds_alternative<ForwardResult>(f)) << AnswerError(f);
    const auto& fr = std::get<ForwardResult>(f);
    const auto ref = Forward<double>(p, in.q64, in.k64, in.v64);
    // float32 arithmetic on short rows: a few ulps of fp32 relative to the largest value.
    EXPECT_LT(RelErr(fr.o, ref.o), 2e-6);
    EXPECT_LT(RelErr(fr.lse, ref.lse), 2e-6);
    auto b = (*kernel)->Backward(p, in.q, in.k, in.v, fr.o, fr.lse, in.dout);
    ASSERT_TRUE(std::holds_alternative<BackwardResult>(b)) << AnswerError(b);
    const auto& br = std::get<BackwardResult>(b);
    const auto gref = Backward<double>(p, in.q64, in.k64, in.v64, in.dout64);
    EXPECT_LT(RelErr(br.dq, gref.dq), 2e-5);
    EXPECT_LT(RelErr(br.dk, gref.dk), 2e-5);
    EXPECT_LT(RelErr(br.dv, gref.dv), 2e-5);
  }
}

TEST(NumpyWorker, IsRegisteredAsTheExecPrefix) {
  REQUIRE_NUMPY();
  const std::string spec = "exec:" + Worker("numpy_worker.py --name np");
  auto kernel = Kernels().Create(spec);
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  EXPECT_EQ((*kernel)->name(), spec);
  EXPECT_EQ((*kernel)->capabilities().profile, "f32");
  EXPECT_TRUE((*kernel)->capabilities().block_sparse);
}

// ---- Forked kernels: the same bits as in process ----

TEST(ForkedKernel, GivesTheSameBitsAsTheKernelInProcess) {
  auto inproc = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(inproc.ok());
  auto forked = MakeForkedKernel([] { return Kernels().Create("cpu/flash2-bf16"); });
  ASSERT_TRUE(forked.ok()) << forked.error().message;
  EXPECT_EQ((*forked)->name(), (*inproc)->name());
  // The same claim, less the learnable sink and relative bias, which the protocol does not
  // carry (serve_protocol.cc describes a forked kernel without them).
  Capabilities inproc_caps = (*inproc)->capabilities();
  EXPECT_TRUE(inproc_caps.sink && inproc_caps.rel_bias);
  EXPECT_FALSE((*forked)->capabilities().sink || (*forked)->capabilities().rel_bias);
  inproc_caps.sink = inproc_caps.rel_bias = false;
  EXPECT_EQ(CapabilitiesToJson((*forked)->capabilities()), CapabilitiesToJson(inproc_caps));
  Problem p = SmallProblem(37, 70);
  p.heads_q = 4;
  p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 64;
  const Inputs in = MakeInputs(p);
  auto a = (*inproc)->Forward(p, in.q, in.k, in.v);
  auto b = (*forked)->Forward(p, in.q, in.k, in.v);
  ASSERT_TRUE(std::holds_alternative<ForwardResult>(b)) << AnswerError(b);
  const auto& fa = std::get<ForwardResult>(a);
  const auto& fb = std::get<ForwardResult>(b);
  EXPECT_TRUE(fa.o.BitwiseEqual(fb.o));
  EXPECT_TRUE(fa.lse.BitwiseEqual(fb.lse));
  auto ga = (*inproc)->Backward(p, in.q, in.k, in.v, fa.o, fa.lse, in.dout);
  auto gb = (*forked)->Backward(p, in.q, in.k, in.v, fb.o, fb.lse, in.dout);
  ASSERT_TRUE(std::holds_alternative<BackwardResult>(gb)) << AnswerError(gb);
  EXPECT_TRUE(std::get<BackwardResult>(ga).dq.BitwiseEqual(std::get<BackwardResult>(gb).dq));
  EXPECT_TRUE(std::get<BackwardResult>(ga).dk.BitwiseEqual(std::get<BackwardResult>(gb).dk));
  EXPECT_TRUE(std::get<BackwardResult>(ga).dv.BitwiseEqual(std::get<BackwardResult>(gb).dv));
}

TEST(ForkedKernel, CarriesLseFalseAndNeverAsksForOrSendsLse) {
  // The client must not require lse in OUT nor send it to the backward (NoLseTestKernel's
  // backward fails if it gets one); the server must not ask the kernel for it.
  auto inproc = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(inproc.ok());
  auto forked = MakeForkedKernel([]() -> Expected<std::unique_ptr<Kernel>> {
    auto inner = Kernels().Create("cpu/flash2-bf16");
    if (!inner) return inner.error();
    return std::unique_ptr<Kernel>(std::make_unique<NoLseTestKernel>(std::move(*inner)));
  });
  ASSERT_TRUE(forked.ok()) << forked.error().message;
  EXPECT_FALSE((*forked)->capabilities().lse);
  const Problem p = SmallProblem(37, 70);
  const Inputs in = MakeInputs(p);
  auto f = (*forked)->Forward(p, in.q, in.k, in.v);
  ASSERT_TRUE(std::holds_alternative<ForwardResult>(f)) << AnswerError(f);
  const auto& fr = std::get<ForwardResult>(f);
  EXPECT_FALSE(fr.lse.defined());
  const auto a = (*inproc)->Forward(p, in.q, in.k, in.v);
  const auto& fa = std::get<ForwardResult>(a);
  EXPECT_TRUE(fa.o.BitwiseEqual(fr.o));
  auto b = (*forked)->Backward(p, in.q, in.k, in.v, fr.o, Tensor(), in.dout);
  ASSERT_TRUE(std::holds_alternative<BackwardResult>(b)) << AnswerError(b);
  auto ga = (*inproc)->Backward(p, in.q, in.k, in.v, fa.o, fa.lse, in.dout);
  EXPECT_TRUE(std::get<BackwardResult>(ga).dq.BitwiseEqual(std::get<BackwardResult>(b).dq));
  EXPECT_TRUE(std::get<BackwardResult>(ga).dv.BitwiseEqual(std::get<BackwardResult>(b).dv));
}

// A kernel that fails in the way its problem's seqlen_q selects, else delegates.
class SabotagedKernel final : public Kernel {
 public:
  explicit SabotagedKernel(std::unique_ptr<Kernel> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "sabotaged"; }
  Capabilities capabilities() const override { return inner_->capabilities(); }
  KernelAnswer<ForwardResult> Forward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v) override {
    std::fprintf(stderr, "sabotaged: forward with seqlen_q %ld\n", static_cast<long>(p.seqlen_q));
    std::fflush(stderr);
    switch (p.seqlen_q) {
      case 13:
        // Default disposition: under ASan its SEGV handler would turn this into exit(1).
        std::signal(SIGSEGV, SIG_DFL);
        std::raise(SIGSEGV);
        break;
      case 14:
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      case 15:
        std::abort();
      case 16:
        _exit(7);
      case 17:
        throw std::runtime_error("thrown from the kernel");
      default:
        break;
    }
    return inner_->Forward(p, q, k, v);
  }
  KernelAnswer<BackwardResult> Backward(const Problem& p, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& o, const Tensor& lse,
                                        const Tensor& dout) override {
    return inner_->Backward(p, q, k, v, o, lse, dout);
  }

 private:
  std::unique_ptr<Kernel> inner_;
};

TEST(ForkedKernel, CrashesHangsAndExitsAreFindingsAndTheNextCallWorks) {
  ExecOptions options;
  options.timeout_s = 1.5;
  auto kernel = MakeForkedKernel(
      []() -> Expected<std::unique_ptr<Kernel>> {
        auto inner = Kernels().Create("cpu/flash2-bf16");
        if (!inner) return inner.error();
        return std::unique_ptr<Kernel>(std::make_unique<SabotagedKernel>(std::move(*inner)));
      },
      options);
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  EXPECT_EQ((*kernel)->name(), "sabotaged");
  const Inputs good = MakeInputs(SmallProblem(8, 8));
  struct Fault {
    int64_t sq;
    std::string expect;
  };
  for (const Fault& f : {Fault{13, "killed by signal SIGSEGV (11)"}, Fault{14, "timed out"},
                         Fault{15, "killed by signal SIGABRT (6)"}, Fault{16, "exited with code 7"},
                         Fault{17, "thrown from the kernel"}}) {
    SCOPED_TRACE(f.sq);
    const Inputs bad = MakeInputs(SmallProblem(f.sq, 8));
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*kernel)->Forward(bad.p, bad.q, bad.k, bad.v);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(std::holds_alternative<Error>(r));
    const std::string msg = std::get<Error>(r).message;
    EXPECT_NE(msg.find(f.expect), std::string::npos) << msg;
    EXPECT_NE(msg.find("sabotaged: forward with seqlen_q " + std::to_string(f.sq)),
              std::string::npos)
        << "the message quotes the worker's stderr: " << msg;
    EXPECT_LT(s, 5.0);
    auto ok = (*kernel)->Forward(good.p, good.q, good.k, good.v);
    EXPECT_TRUE(std::holds_alternative<ForwardResult>(ok)) << AnswerError(ok);
  }
}

// ---- The exec: client against misbehaving workers ----

struct Misbehaviour {
  std::string mode;
  std::string op;       // the request the fault hits
  std::string expect;   // in the Error message ("" for an Unsupported answer)
};

class FaultyWorker : public ::testing::TestWithParam<Misbehaviour> {};

TEST_P(FaultyWorker, BecomesAFindingAndTheNextCallSucceeds) {
  REQUIRE_NUMPY();
  const Misbehaviour& m = GetParam();
  ExecOptions options;
  options.timeout_s = 10;
  auto kernel = MakeExecKernel(
      Worker(fmt::format("faulty_worker.py --mode {} --op {} --when-seqlen-q 13", m.mode, m.op)),
      options);
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  const Inputs bad = MakeInputs(SmallProblem(13, 8));
  const Inputs good = MakeInputs(SmallProblem(8, 8));
  auto fwd = [&](const Inputs& in) { return (*kernel)->Forward(in.p, in.q, in.k, in.v); };
  auto bwd = [&](const Inputs& in) -> KernelAnswer<BackwardResult> {
    auto f = fwd(in);
    if (!std::holds_alternative<ForwardResult>(f)) return Error{"forward: " + AnswerError(f)};
    const auto& r = std::get<ForwardResult>(f);
    return (*kernel)->Backward(in.p, in.q, in.k, in.v, r.o, r.lse, in.dout);
  };
  const std::string msg = m.op == "forward" ? AnswerError(fwd(bad)) : AnswerError(bwd(bad));
  if (m.expect.empty()) {
    EXPECT_EQ(msg, "unsupported: deliberate refusal");
  } else {
    EXPECT_NE(msg.find(m.expect), std::string::npos) << msg;
    EXPECT_EQ(msg.find("exec:"), 0u) << "the message names the kernel: " << msg;
  }
  // The next call (on a restarted worker where the fault killed it) works.
  auto again = bwd(good);
  EXPECT_TRUE(std::holds_alternative<BackwardResult>(again)) << AnswerError(again);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, FaultyWorker,
    ::testing::Values(
        Misbehaviour{"crash", "forward", "killed by signal SIGSEGV (11)"},
        Misbehaviour{"abort", "backward", "killed by signal SIGABRT (6)"},
        Misbehaviour{"exit", "forward", "exited with code 3"},
        Misbehaviour{"exit", "backward", "faulty_worker: fault 'exit' on backward"},
        Misbehaviour{"garbage", "forward", "reply is not a JSON object"},
        Misbehaviour{"partial", "forward", "after a partial reply '{\"status\": \"o'"},
        Misbehaviour{"noise", "forward", R"("loading weights... done")"},
        Misbehaviour{"no-file", "forward", "outputs file is unusable"},
        Misbehaviour{"missing", "forward", "output 'lse' missing from the outputs file (it holds: o)"},
        Misbehaviour{"wrong-shape", "forward", "output 'o' has shape [16, 2, 13, 1], expected "
                                               "[1, 13, 2, 16]"},
        Misbehaviour{"wrong-dtype", "backward", "output 'dq' has dtype i32, not a float format"},
        Misbehaviour{"missing", "backward", "output 'dk' missing"},
        Misbehaviour{"error", "forward", "worker reported an error: deliberate failure"},
        // Declared exiting: the next call goes to a fresh worker, not to the dying one.
        Misbehaviour{"error-exit", "forward", "(the worker exits after this error"},
        Misbehaviour{"error-exit", "backward", "(the worker exits after this error"},
        Misbehaviour{"bad-status", "forward", "unknown status \"maybe\""},
        Misbehaviour{"unsupported", "forward", ""}),
    [](const auto& info) {
      std::string n = info.param.mode + "_" + info.param.op;
      for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return n;
    });

TEST(ExecKernel, TheOptionalRouteFieldIsTheLastRoute) {
  REQUIRE_NUMPY();
  auto kernel = MakeExecKernel(Worker("faulty_worker.py --mode route --when-seqlen-q 13"));
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  const Inputs slow = MakeInputs(SmallProblem(13, 8));
  const Inputs plain = MakeInputs(SmallProblem(8, 8));
  auto r = (*kernel)->Forward(slow.p, slow.q, slow.k, slow.v);
  ASSERT_TRUE(std::holds_alternative<ForwardResult>(r)) << AnswerError(r);
  EXPECT_EQ((*kernel)->last_route(), "slow path");
  r = (*kernel)->Forward(plain.p, plain.q, plain.k, plain.v);
  ASSERT_TRUE(std::holds_alternative<ForwardResult>(r)) << AnswerError(r);
  EXPECT_EQ((*kernel)->last_route(), "");
}

TEST(ExecKernel, AHangIsKilledWithItsProcessGroup) {
  REQUIRE_NUMPY();
  const fs::path pid_file = fs::temp_directory_path() / fmt::format("attest-p2-{}.pid", getpid());
  ExecOptions options;
  options.timeout_s = 1.5;
  auto kernel = MakeExecKernel(
      Worker("faulty_worker.py --mode hang-child --pid-file " + pid_file.string()), options);
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  const Inputs in = MakeInputs(SmallProblem());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = (*kernel)->Forward(in.p, in.q, in.k, in.v);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string msg = AnswerError(r);
  EXPECT_NE(msg.find("timed out: no reply within 1.5 s (process group killed"), std::string::npos)
      << msg;
  EXPECT_GE(s, 1.4);
  EXPECT_LT(s, 4.0);
  // The helper it started (`sleep 300`) is gone too: no such process, or a zombie waiting
  // for the init process to reap it.
  std::ifstream f(pid_file);
  long child = 0;
  ASSERT_TRUE(f >> child);
  fs::remove(pid_file);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::ifstream stat(fmt::format("/proc/{}/stat", child));
  std::string pid_text, comm, state;
  if (stat >> pid_text >> comm >> state) EXPECT_EQ(state, "Z") << "sleep " << child << " survived";
}

TEST(ExecKernel, AWorkerThatStopsReadingDoesNotKillTheHarness) {
  REQUIRE_NUMPY();
  // It answers describe and exits; the next request's write meets a closed pipe (SIGPIPE
  // must not end this process) or its read meets EOF.
  auto kernel = MakeExecKernel(Worker("faulty_worker.py --mode exit-early"));
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  const Inputs in = MakeInputs(SmallProblem());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto r = (*kernel)->Forward(in.p, in.q, in.k, in.v);
  const std::string msg = AnswerError(r);
  EXPECT_TRUE(msg.find("stopped reading requests") != std::string::npos ||
              msg.find("exited with code 0 before replying") != std::string::npos)
      << msg;
}

TEST(ExecKernel, StartFailuresAreErrorsNamingTheCause) {
  auto missing = MakeExecKernel("/nonexistent/attest-worker --flag");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("cannot start '/nonexistent/attest-worker': No such file"),
            std::string::npos)
      << missing.error().message;
  auto quote = MakeExecKernel("python3 'unterminated");
  ASSERT_FALSE(quote.ok());
  EXPECT_NE(quote.error().message.find("unterminated '"), std::string::npos);
  auto dies = MakeExecKernel("sh -c 'echo cannot import torch >&2; exit 4'");
  ASSERT_FALSE(dies.ok());
  EXPECT_NE(dies.error().message.find("describe: worker exited with code 4 before replying; "
                                      "stderr: cannot import torch"),
            std::string::npos)
      << dies.error().message;
  if (HaveNumpy()) {
    auto bad = MakeExecKernel(Worker("faulty_worker.py --mode bad-describe --op describe"));
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("describe: reply is not a JSON object"), std::string::npos)
        << bad.error().message;
    // The protocol carries no sink yet: a worker claiming one is refused, naming the field.
    auto sink = MakeExecKernel(Worker("numpy_worker.py --claim-sink"));
    ASSERT_FALSE(sink.ok());
    EXPECT_NE(sink.error().message.find("capabilities.sink: true is not supported by the exec "
                                        "protocol"),
              std::string::npos)
        << sink.error().message;
    auto bias = MakeExecKernel(Worker("numpy_worker.py --claim-rel-bias"));
    ASSERT_FALSE(bias.ok());
    EXPECT_NE(bias.error().message.find("capabilities.rel_bias: true is not supported by the "
                                        "exec protocol"),
              std::string::npos)
        << bias.error().message;
  }
}

TEST(ExecKernel, TensorFilesLiveInAPrivateDirectoryRemovedAfterwards) {
  REQUIRE_NUMPY();
  const fs::path root = fs::temp_directory_path() / fmt::format("attest-p2-root-{}", getpid());
  fs::remove_all(root);
  fs::create_directories(root);
  ExecOptions options;
  options.tmp_root = root.string();
  {
    auto kernel = MakeExecKernel(Worker("numpy_worker.py"), options);
    ASSERT_TRUE(kernel.ok()) << kernel.error().message;
    std::vector<fs::path> dirs(fs::directory_iterator(root), fs::directory_iterator{});
    ASSERT_EQ(dirs.size(), 1u);
    EXPECT_EQ(dirs[0].filename().string().rfind("attest-exec-", 0), 0u);
    EXPECT_EQ(fs::status(dirs[0]).permissions() & fs::perms::all, fs::perms::owner_all);
    const Inputs in = MakeInputs(SmallProblem());
    auto r = (*kernel)->Forward(in.p, in.q, in.k, in.v);
    EXPECT_TRUE(std::holds_alternative<ForwardResult>(r)) << AnswerError(r);
    EXPECT_TRUE(fs::is_empty(dirs[0])) << "per-call files are removed after the call";
  }
  EXPECT_TRUE(fs::is_empty(root)) << "the private directory goes with the kernel";
  fs::remove_all(root);
}

// ---- The worker side for C++ kernels ----

TEST(ServeProtocol, AnswersBadRequestsWithErrorsAndStopsAtEof) {
  auto kernel = Kernels().Create("cpu/flash2-bf16");
  ASSERT_TRUE(kernel.ok());
  int in[2], out[2];
  ASSERT_EQ(pipe(in), 0);
  ASSERT_EQ(pipe(out), 0);
  const std::string requests =
      "not json\n\n{\"op\":\"dance\"}\n{\"op\":\"forward\"}\n"
      "{\"op\":\"forward\",\"problem\":{\"heads_q\":3,\"heads_kv\":2},\"inputs\":\"x\","
      "\"outputs\":\"y\"}\n"
      "{\"op\":\"forward\",\"problem\":{},\"inputs\":\"/nonexistent.safetensors\","
      "\"outputs\":\"y\"}\n"
      "{\"op\":\"describe\"}\n";
  ASSERT_EQ(write(in[1], requests.data(), requests.size()), static_cast<ssize_t>(requests.size()));
  close(in[1]);
  EXPECT_EQ(ServeProtocol(**kernel, in[0], out[1]), 0);
  close(in[0]);
  close(out[1]);
  std::string replies;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) replies.append(buf, static_cast<size_t>(n));
  close(out[0]);
  std::vector<nlohmann::json> lines;
  for (size_t pos = 0, nl; (nl = replies.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    lines.push_back(nlohmann::json::parse(replies.substr(pos, nl - pos)));
  }
  ASSERT_EQ(lines.size(), 6u) << replies;
  EXPECT_EQ(lines[0]["message"], "request is not JSON");
  EXPECT_EQ(lines[1]["message"], "request: unknown op \"dance\" (describe, forward, backward)");
  EXPECT_EQ(lines[2]["message"], "request: \"problem\" missing");
  EXPECT_EQ(lines[3]["message"], "problem.heads_q: 3 is not a multiple of heads_kv = 2");
  EXPECT_NE(lines[4]["message"].get<std::string>().find("/nonexistent.safetensors"),
            std::string::npos);
  EXPECT_EQ(lines[5]["status"], "ok");
  EXPECT_EQ(lines[5]["name"], "cpu/flash2-bf16");
}

}  // namespace
}  // namespace attest
