// Tests of the mutant catalogue (mutants.h): the catalogue has >= 18 rows with unique names,
// every row is registered as mutant/<name> and claims exactly its parent's capabilities, and
// every mutant, run through its documented case, differs from its parent in exactly the
// outputs the row lists (and, where the row says so, lies further from the float64 oracle
// than the parent does). The nondeterministic-dq mutant also differs from itself run to run.
#include "kernels/mutants/mutants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/builtin.h"
#include "reference/data/generate.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/recipes/recipe.h"

namespace attest {
namespace {

constexpr const char* kOutputs[] = {"o", "lse", "dq", "dk", "dv", "dsink", "drel_bias"};

struct Inputs {
  Tensor q, k, v, dout;  // f64 holding the dtype-rounded values the kernel sees
  Tensor sink;           // [Hq] f64 holding float32 values: a problem with a sink only
  Tensor rel_bias;       // [Hq, W] f64 holding float32 values: with a relative bias only
};

Inputs CaseInputs(const MutantSpec& s) {
  Expected<GeneratedInputs> g = GenerateInputs(s.problem, s.generator);
  EXPECT_TRUE(g.ok()) << s.name << ": " << (g.ok() ? "" : g.error().message);
  const DType d = s.problem.dtype;
  return {RoundTensor(g->q, d), RoundTensor(g->k, d), RoundTensor(g->v, d),
          RoundTensor(g->dout, d),
          s.problem.sink ? RoundTensor(g->sink, DType::kF32) : Tensor(),
          s.problem.rel_bias ? RoundTensor(g->rel_bias, DType::kF32) : Tensor()};
}

// The inputs as a model hands them over: a transpose of heads-major [B, H, S, X] storage.
Inputs HeadsMajor(const Inputs& in) {
  auto view = [](const Tensor& t) {
    Tensor storage = Tensor::Zeros(t.dtype(), {t.dim(0), t.dim(2), t.dim(1), t.dim(3)});
    Tensor v = storage.Permute({0, 2, 1, 3});
    v.CopyFrom(t);
    return v;
  };
  return {view(in.q), view(in.k), view(in.v), view(in.dout), in.sink, in.rel_bias};
}

struct Outputs {
  std::map<std::string, Tensor> t;  // o, lse, dq, dk, dv as the kernel returned them
};

// `backward`: whether the kernel under test claims one (the mutant's, i.e. the registered
// parent's, claim; cpu/fp8-e4m3-tensor is forward-only: its gradients compare as empty).
Outputs RunKernel(Kernel& kernel, const Problem& p, const Inputs& in, bool backward = true) {
  Outputs out;
  const Tensor none = Tensor::Zeros(DType::kF32, {0});
  KernelAnswer<ForwardResult> f =
      p.rel_bias ? kernel.ForwardRelBias(p, in.q, in.k, in.v, in.rel_bias, in.sink)
      : p.sink   ? kernel.ForwardSink(p, in.q, in.k, in.v, in.sink)
                 : kernel.Forward(p, in.q, in.k, in.v);
  if (!std::holds_alternative<ForwardResult>(f)) {
    ADD_FAILURE() << kernel.name() << ": forward gave no result";
    return out;
  }
  const ForwardResult& fr = std::get<ForwardResult>(f);
  if (!backward) {
    out.t = {{"o", fr.o},   {"lse", fr.lse}, {"dq", none},
             {"dk", none},  {"dv", none},    {"dsink", none}, {"drel_bias", none}};
    return out;
  }
  KernelAnswer<BackwardResult> b =
      p.rel_bias ? kernel.BackwardRelBias(p, in.q, in.k, in.v, fr.o, fr.lse, in.dout,
                                          in.rel_bias, in.sink)
      : p.sink   ? kernel.BackwardSink(p, in.q, in.k, in.v, fr.o, fr.lse, in.dout, in.sink)
                 : kernel.Backward(p, in.q, in.k, in.v, fr.o, fr.lse, in.dout);
  if (!std::holds_alternative<BackwardResult>(b)) {
    ADD_FAILURE() << kernel.name() << ": backward gave no result";
    return out;
  }
  const BackwardResult& br = std::get<BackwardResult>(b);
  out.t = {{"o", fr.o},   {"lse", fr.lse}, {"dq", br.dq},
           {"dk", br.dk}, {"dv", br.dv},   {"dsink", p.sink ? br.dsink : none},
           {"drel_bias", p.rel_bias ? br.drel_bias : none}};
  return out;
}

// max |x − ref| over elements; equal values (infinities included) count 0, a NaN or an
// infinity where the other is different counts +inf.
double MaxErr(const Tensor& x, const Tensor& ref) {
  const Tensor a = ToF64(x), b = ToF64(ref);
  auto av = a.span<const double>(), bv = b.span<const double>();
  double worst = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    if (av[i] == bv[i]) continue;
    const double e = std::fabs(av[i] - bv[i]);
    worst = std::max(worst, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
  }
  return worst;
}

std::string Names(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : ",") + x;
  return out;
}

TEST(MutantCatalogue, HasUniqueRegisteredRowsClaimingTheirParentsCapabilities) {
  const auto rows = MutantCatalogue();
  EXPECT_GE(rows.size(), 18u);
  std::set<std::string_view> names;
  const std::vector<std::string> registered = Kernels().Names();
  for (const MutantSpec& s : rows) {
    SCOPED_TRACE(std::string(s.name));
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate name";
    EXPECT_FALSE(s.bug.empty());
    EXPECT_FALSE(s.change.empty());
    EXPECT_FALSE(s.differs.empty());
    // The check names of verify/checks/registry.cc (kernels/ does not link verify/; the
    // first-failure test there checks the names against the registry itself).
    static constexpr std::string_view kClasses[] = {
        "accuracy",    "non-interference", "consistency", "determinism",
        "unwritten-outputs", "special-values", "gqa-mha", "permutation",
        "window-causal", "padding", "layouts", "honesty", "bias", "splits-agree"};
    EXPECT_TRUE(std::find(std::begin(kClasses), std::end(kClasses), s.bug_class) !=
                std::end(kClasses))
        << "bug_class '" << s.bug_class << "'";
    const std::vector<const MutantSpec*> same_class = MutantsByClass(s.bug_class);
    EXPECT_NE(std::find(same_class.begin(), same_class.end(), &s), same_class.end());
    for (std::string_view d : s.differs) {
      EXPECT_TRUE(std::find(std::begin(kOutputs), std::end(kOutputs), d) != std::end(kOutputs));
    }
    const std::string full = "mutant/" + std::string(s.name);
    EXPECT_TRUE(std::find(registered.begin(), registered.end(), full) != registered.end())
        << full << " not registered";
    EXPECT_EQ(FindMutant(full), &s);
    EXPECT_EQ(ParentRecipe(s).name, s.parent_recipe);
    EXPECT_EQ(MutantRecipe(s).name, s.parent_recipe);  // the mutant claims the parent's recipe
    Expected<std::unique_ptr<Kernel>> mutant = Kernels().Create(full);
    ASSERT_TRUE(mutant.ok());
    Expected<std::unique_ptr<Kernel>> parent = Kernels().Create(s.parent);
    Capabilities parent_caps =
        parent.ok() ? (*parent)->capabilities() : MakeParent(s)->capabilities();
    // The parent's claims (less the learnable sink unless the row is a sink deviation,
    // mutants.cc), narrowed where the row says the mutant's API is top-left only.
    const bool sink_row = s.sink_fault != SinkFault::kNone;
    EXPECT_EQ((*mutant)->capabilities().sink, sink_row && parent_caps.sink);
    if (!sink_row) parent_caps.sink = false;
    const bool bias_row = s.rel_bias_fault != RelBiasFault::kNone;  // likewise the bias
    EXPECT_EQ((*mutant)->capabilities().rel_bias, bias_row && parent_caps.rel_bias);
    if (!bias_row) parent_caps.rel_bias = false;
    Capabilities claimed = parent_caps;
    if (s.claims_causal_top_left_only) claimed.causal_top_left_only = true;
    EXPECT_EQ(CapabilitiesToJson((*mutant)->capabilities()), CapabilitiesToJson(claimed));
    EXPECT_TRUE(parent_caps.Covers(s.problem)) << "documented case outside the parent's claims";
    EXPECT_TRUE(claimed.Covers(s.problem)) << "documented case outside the mutant's claims";
    EXPECT_TRUE(Validate(s.problem).ok());
  }
  std::printf("mutant catalogue: %zu rows\n", rows.size());
}

class MutantCase : public ::testing::TestWithParam<std::string_view> {};

TEST_P(MutantCase, DiffersFromItsParentOnTheDocumentedCase) {
  const MutantSpec& s = *FindMutant(GetParam());
  const Problem& p = s.problem;
  const Inputs in = CaseInputs(s);
  const Inputs kin = s.heads_major_inputs ? HeadsMajor(in) : in;  // what the kernels are handed
  std::unique_ptr<Kernel> parent = MakeParent(s);
  Expected<std::unique_ptr<Kernel>> mutant = Kernels().Create("mutant/" + std::string(s.name));
  ASSERT_TRUE(mutant.ok());
  const bool backward = (*mutant)->capabilities().backward;
  const Outputs po = RunKernel(*parent, p, kin, backward);
  const Outputs mo = RunKernel(**mutant, p, kin, backward);
  ASSERT_EQ(po.t.size(), 7u);
  ASSERT_EQ(mo.t.size(), 7u);

  // The local parent is the registered parent, bit for bit, where one is registered.
  Expected<std::unique_ptr<Kernel>> registered = Kernels().Create(s.parent);
  if (registered.ok() && FindRecipe(s.parent_recipe) != nullptr) {
    const Outputs ro = RunKernel(**registered, p, kin, backward);
    for (const char* name : kOutputs) {
      EXPECT_TRUE(ro.t.at(name).BitwiseEqual(po.t.at(name)))
          << "registered parent differs in " << name;
    }
  }

  // Exactly the listed outputs differ.
  std::set<std::string> differ, expected(s.differs.begin(), s.differs.end());
  for (const char* name : kOutputs) {
    if (!po.t.at(name).BitwiseEqual(mo.t.at(name))) differ.insert(name);
  }
  EXPECT_EQ(Names(differ), Names(expected));

  // Against the float64 oracle on the same (rounded) inputs.
  OracleOptions options;
  if (p.sink) options.sink = &in.sink;
  if (p.rel_bias) options.rel_bias = &in.rel_bias;
  const BackwardOut ref = Backward<double>(p, in.q, in.k, in.v, in.dout, options);
  const std::map<std::string, const Tensor*> oracle = {
      {"o", &ref.o},   {"lse", &ref.lse}, {"dq", &ref.dq},
      {"dk", &ref.dk}, {"dv", &ref.dv},   {"dsink", &ref.dsink}, {"drel_bias", &ref.drel_bias}};
  bool worse = false;
  std::string report;
  for (std::string_view d : s.differs) {
    const std::string name(d);
    const double pe = MaxErr(po.t.at(name), *oracle.at(name));
    const double me = MaxErr(mo.t.at(name), *oracle.at(name));
    worse = worse || me > pe;
    char line[160];
    std::snprintf(line, sizeof line, " %s parent %.3g mutant %.3g;", name.c_str(), pe, me);
    report += line;
  }
  std::printf("mutant/%s vs %s: max|x - oracle|:%s\n", std::string(s.name).c_str(),
              std::string(s.parent).c_str(), report.c_str());
  if (s.worse_than_parent) {
    EXPECT_TRUE(worse) << "no listed output is further from the oracle";
  }
}

std::vector<std::string_view> AllNames() {
  std::vector<std::string_view> out;
  for (const MutantSpec& s : MutantCatalogue()) out.push_back(s.name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Catalogue, MutantCase, ::testing::ValuesIn(AllNames()),
                         [](const ::testing::TestParamInfo<std::string_view>& info) {
                           std::string n(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A mutant that claims determinism while its dQ changes from run to run: repeat backward
// calls on one kernel object give identical o, dk, dv and not always the same dq bits (the
// fp32 orders differ every call; after the bf16 rounding most, not all, elements agree).
TEST(MutantCatalogue, NondeterministicDqVariesRunToRunWhileClaimingDeterminism) {
  const MutantSpec& s = *FindMutant("nondeterministic-dq");
  const Inputs in = CaseInputs(s);
  Expected<std::unique_ptr<Kernel>> k = Kernels().Create("mutant/nondeterministic-dq");
  ASSERT_TRUE(k.ok());
  EXPECT_TRUE((*k)->capabilities().deterministic);
  const Outputs first = RunKernel(**k, s.problem, in);
  ASSERT_EQ(first.t.size(), 7u);
  int dq_changes = 0;
  for (int run = 0; run < 3; ++run) {
    const Outputs again = RunKernel(**k, s.problem, in);
    ASSERT_EQ(again.t.size(), 7u);
    EXPECT_TRUE(first.t.at("o").BitwiseEqual(again.t.at("o")));
    EXPECT_TRUE(first.t.at("dk").BitwiseEqual(again.t.at("dk")));
    EXPECT_TRUE(first.t.at("dv").BitwiseEqual(again.t.at("dv")));
    dq_changes += first.t.at("dq").BitwiseEqual(again.t.at("dq")) ? 0 : 1;
  }
  EXPECT_GT(dq_changes, 0) << "dq was bitwise equal in 4 runs";
  std::printf("nondeterministic-dq: dq differed from the first run in %d of 3 repeats\n",
              dq_changes);
}

// Whether tokens [t0, t1) of a [tokens, H, W] (or [1, S, H, W]) tensor are bitwise equal.
bool TokensEqual(const Tensor& a, const Tensor& b, int64_t t0, int64_t t1) {
  const Tensor x = ToF64(a), y = ToF64(b);
  const int64_t per_token = x.numel() / x.dim(x.rank() - 3);
  auto xv = x.span<const double>(), yv = y.span<const double>();
  for (int64_t i = t0 * per_token; i < t1 * per_token; ++i) {
    const size_t e = static_cast<size_t>(i);
    if (std::bit_cast<uint64_t>(xv[e]) != std::bit_cast<uint64_t>(yv[e])) return false;
  }
  return true;
}

// Multiplies token `t` of every head of a [tokens, H, W] (or [1, S, H, W]) f64 tensor by
// 2^16 (exact in bf16): its 32-blocks along the sequence get a scale 2^16 larger.
Tensor ScaleToken(const Tensor& x, int64_t t) {
  Tensor out = x.Clone();
  const int64_t per_token = out.numel() / out.dim(out.rank() - 3);
  auto v = out.span<double>();
  for (int64_t i = t * per_token; i < (t + 1) * per_token; ++i)
    v[static_cast<size_t>(i)] *= 65536.0;
  return out;
}

// The leakage the two scale-sharing mutants reproduce, shown on their documented cases: a
// value the rows must not see (a future key; a key of another document) changes them in the
// mutant through the shared block scale, and leaves the parent's bits alone.
TEST(MutantCatalogue, SharedScaleMutantsLeakWhereTheirParentsDoNot) {
  {
    // Causal 96 x 96: rows 32..40 see keys 32..40, which share V's block [32, 64) with key 50.
    const MutantSpec& s = *FindMutant("v-scale-crosses-causal");
    const Inputs in = CaseInputs(s);
    Inputs hit = in;
    hit.v = ScaleToken(in.v, 50);
    std::unique_ptr<Kernel> parent = MakeParent(s);
    MutantKernel mutant(s);
    const Outputs p0 = RunKernel(*parent, s.problem, in), p1 = RunKernel(*parent, s.problem, hit);
    const Outputs m0 = RunKernel(mutant, s.problem, in), m1 = RunKernel(mutant, s.problem, hit);
    ASSERT_EQ(p1.t.size(), 7u);
    ASSERT_EQ(m1.t.size(), 7u);
    EXPECT_TRUE(TokensEqual(p0.t.at("o"), p1.t.at("o"), 0, 50));
    EXPECT_FALSE(TokensEqual(m0.t.at("o"), m1.t.at("o"), 0, 50));
  }
  {
    // Packed documents [0, 40) and [40, 100): K's block [32, 64) along the packed axis holds
    // keys of both; a key of document 2 moves document 1's dq.
    const MutantSpec& s = *FindMutant("doc-scale-crosses-boundary");
    const Inputs in = CaseInputs(s);
    Inputs hit = in;
    hit.k = ScaleToken(in.k, 50);
    std::unique_ptr<Kernel> parent = MakeParent(s);
    MutantKernel mutant(s);
    const Outputs p0 = RunKernel(*parent, s.problem, in), p1 = RunKernel(*parent, s.problem, hit);
    const Outputs m0 = RunKernel(mutant, s.problem, in), m1 = RunKernel(mutant, s.problem, hit);
    ASSERT_EQ(p1.t.size(), 7u);
    ASSERT_EQ(m1.t.size(), 7u);
    EXPECT_TRUE(TokensEqual(p0.t.at("dq"), p1.t.at("dq"), 0, 40));
    EXPECT_FALSE(TokensEqual(m0.t.at("dq"), m1.t.at("dq"), 0, 40));
  }
}

// Problem faults rewrite exactly the parameter they name.
TEST(MutantCatalogue, ProblemFaultsRewriteTheirParameter) {
  Problem p;
  p.seqlen_q = 96;
  p.seqlen_k = 32;
  p.window_left = 16;
  EXPECT_EQ(ApplyProblemFault(p, ProblemFault::kWindowRightClamped).window_right, 32);
  p.window_right = 4;
  EXPECT_EQ(ApplyProblemFault(p, ProblemFault::kWindowRightClamped).window_right, 4);
  p.window_left = p.window_right = -1;
  EXPECT_EQ(ApplyProblemFault(p, ProblemFault::kWindowRightClamped), p);  // no window: as is
  p.causal = true;
  EXPECT_EQ(ApplyProblemFault(p, ProblemFault::kCausalTopLeft).causal_align, CausalAlign::kTopLeft);
  EXPECT_EQ(ApplyProblemFault(p, ProblemFault::kNone), p);
}

// --- The documentation against the catalogue -------------------------------------------------

std::string ReadDoc(const char* path) {
  std::ifstream in(std::string(ATTEST_SOURCE_DIR) + "/" + path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream in(row);
  std::string cell;
  std::getline(in, cell, '|');  // before the first bar
  while (std::getline(in, cell, '|')) {
    const size_t a = cell.find_first_not_of(" `"), b = cell.find_last_not_of(" `");
    out.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
  }
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

// docs/kernels.md's mutant table has one row per catalogue entry, with its parent, the
// outputs it differs in on its case, and its bug_class: the table is checked against the
// catalogue it describes, so neither can drift alone.
TEST(MutantDocs, TheTableInDocsKernelsIsTheCatalogue) {
  const std::string doc = ReadDoc("docs/kernels.md");
  std::stringstream lines(doc);
  std::string line;
  bool in_table = false;
  std::map<std::string, std::vector<std::string>> rows;
  while (std::getline(lines, line)) {
    if (line.rfind("| mutant | parent |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|---", 0) == 0) continue;
    if (line.rfind("| ", 0) != 0) break;
    const std::vector<std::string> cells = Cells(line);
    ASSERT_EQ(cells.size(), 7u) << line;
    rows[cells[0]] = cells;
  }
  ASSERT_FALSE(rows.empty()) << "no mutant table in docs/kernels.md";
  EXPECT_EQ(rows.size(), MutantCatalogue().size());
  for (const MutantSpec& m : MutantCatalogue()) {
    const auto it = rows.find(std::string(m.name));
    ASSERT_NE(it, rows.end()) << m.name << " is not in docs/kernels.md's mutant table";
    const std::vector<std::string>& cells = it->second;
    EXPECT_EQ(cells[1], m.parent) << m.name;
    EXPECT_EQ(cells[6], m.bug_class) << m.name;
    std::string differs;
    for (std::string_view t : m.differs) differs += (differs.empty() ? "" : ", ") + std::string(t);
    EXPECT_EQ(cells[5], differs) << m.name;
  }
}

// Where the documentation counts the mutants ("N mutants"; a subset is written "6 of the 24
// mutants"), it counts the catalogue.
TEST(MutantDocs, CountsInTheDocumentationMatchTheCatalogue) {
  const std::regex count(R"(\b(\d+) (seeded )?mutants\b)");
  int seen = 0;
  for (const char* path : {"README.md", "docs/checks.md", "docs/fuzz.md", "docs/kernels.md"}) {
    const std::string doc = ReadDoc(path);
    for (auto it = std::sregex_iterator(doc.begin(), doc.end(), count);
         it != std::sregex_iterator(); ++it) {
      EXPECT_EQ(std::stoul((*it)[1].str()), MutantCatalogue().size()) << path << ": " << it->str();
      ++seen;
    }
  }
  EXPECT_GT(seen, 0);
}

}  // namespace
}  // namespace attest
