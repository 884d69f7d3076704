// Tests of the golden machinery (manifest.h, catalog.h, golden.h): manifest parsing, the
// catalogue's feature coverage, regen determinism, and that verify tells drift (exit 1) from
// corruption (exit 2), naming the case and the tensor.
#include "reference/golden/golden.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <vector>
#include <string>

#include <gtest/gtest.h>

#include "reference/case/case_file.h"
#include "reference/case/inputs.h"
#include "reference/golden/catalog.h"
#include "reference/golden/manifest.h"
#include "reference/golden/sha256.h"
#include "reference/io/safetensors.h"
#include "reference/problem/mask.h"

namespace attest {
namespace {

namespace fs = std::filesystem;

// A fresh, empty folder under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = fs::temp_directory_path() /
            ("attest_golden_" + tag + "_" + std::to_string(::testing::UnitTest::GetInstance()
                                                               ->random_seed()) +
             "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// --- Manifest ----------------------------------------------------------------------------

GoldenEntry SampleEntry(std::string name) {
  GoldenEntry e;
  e.name = std::move(name);
  e.problem.seqlen_q = 3;
  e.provenance = {"gaussian", 7, {{"std", 2.0}}, "0.1.0", "abc", "mp256", "2026-01-01T00:00:00Z"};
  e.sha256[GoldenCaseFile(e.name)] = std::string(64, 'a');
  return e;
}

TEST(GoldenManifest, RoundTripsAndKeepsNameOrder) {
  GoldenManifest m;
  m.Upsert(SampleEntry("zeta"));
  m.Upsert(SampleEntry("alpha"));
  m.Upsert(SampleEntry("alpha"));  // replaces, does not duplicate
  ASSERT_EQ(m.cases.size(), 2u);
  EXPECT_EQ(m.cases[0].name, "alpha");
  auto back = ManifestFromJson(ManifestToJson(m), "mem");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  EXPECT_EQ(back->Find("zeta")->provenance, m.Find("zeta")->provenance);
}

TEST(GoldenManifest, ErrorsNameTheField) {
  GoldenManifest m;
  m.Upsert(SampleEntry("a"));
  nlohmann::json j = ManifestToJson(m);
  j["cases"][0]["sha256"]["a.case.json"] = "xyz";
  auto bad = ManifestFromJson(j, "m.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("m.json: cases[0].sha256.a.case.json"), std::string::npos)
      << bad.error().message;

  j = ManifestToJson(m);
  j["cases"].push_back(j["cases"][0]);
  bad = ManifestFromJson(j, "m.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("duplicate 'a'"), std::string::npos);

  j = ManifestToJson(m);
  j["cases"][0]["name"] = "../etc";
  EXPECT_FALSE(ManifestFromJson(j, "m.json").ok());
  j = ManifestToJson(m);
  j["version"] = 2;
  EXPECT_FALSE(ManifestFromJson(j, "m.json").ok());
}

// --- Catalogue -----------------------------------------------------------------------------

TEST(GoldenCatalog, CoversEveryFeature) {
  const auto cases = GoldenCatalog();
  ASSERT_GE(cases.size(), 30u);
  int64_t score_entries = 0;
  auto any = [&](auto pred) {
    return std::any_of(cases.begin(), cases.end(),
                       [&](const GoldenCaseSpec& c) { return pred(c.problem); });
  };
  for (size_t n = 0; n < cases.size(); ++n) {
    const Problem& p = cases[n].problem;
    EXPECT_TRUE(Validate(p).ok()) << cases[n].name << ": " << Validate(p).error().message;
    if (n > 0) EXPECT_LT(cases[n - 1].name, cases[n].name) << "sorted, unique names";
    EXPECT_EQ(FindGoldenCase(cases[n].name), &cases[n]);
    score_entries += p.heads_q * p.TotalQ() * p.seqlen_k;
  }
  // Small enough that the mp256 regen stays in minutes.
  EXPECT_LT(score_entries, 400'000);
  using CA = CausalAlign;
  EXPECT_TRUE(any([](const Problem& p) {
    return !p.causal && p.window_left < 0 && p.window_right < 0 && !p.block_sparse &&
           !p.document_ids_q && !p.varlen() && p.softcap == 0 && !p.alibi_slopes;
  }));
  EXPECT_TRUE(any([&](const Problem& p) {
    return p.causal && p.causal_align == CA::kBottomRight && p.seqlen_q > p.seqlen_k;
  }));
  EXPECT_TRUE(any([&](const Problem& p) {
    return p.causal && p.causal_align == CA::kBottomRight && p.seqlen_q < p.seqlen_k;
  }));
  EXPECT_TRUE(any([&](const Problem& p) { return p.causal && p.causal_align == CA::kTopLeft; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.window_left == 0 && p.window_right == 0; }));
  EXPECT_TRUE(any([](const Problem& p) {
    return p.window_left >= p.seqlen_k && p.window_right >= p.seqlen_k;
  }));
  EXPECT_TRUE(any([](const Problem& p) { return p.window_left >= 0 && p.window_right < 0; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.window_left < 0 && p.window_right >= 0; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.prefix_lm > 0; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.document_ids_q.has_value(); }));
  EXPECT_TRUE(any([](const Problem& p) { return p.block_sparse.has_value(); }));
  EXPECT_TRUE(any([](const Problem& p) { return p.gqa_ratio() == 2; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.gqa_ratio() == 4; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.head_dim_v != p.head_dim; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.softcap > 0 && !p.alibi_slopes; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.alibi_slopes && p.softcap == 0; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.alibi_slopes && p.softcap > 0 && p.causal; }));
  auto zero_len = [](const std::optional<std::vector<int32_t>>& cu) {
    if (!cu) return false;
    for (size_t b = 0; b + 1 < cu->size(); ++b) {
      if ((*cu)[b] == (*cu)[b + 1]) return true;
    }
    return false;
  };
  EXPECT_TRUE(any([&](const Problem& p) { return zero_len(p.cu_seqlens_q); }));
  EXPECT_TRUE(any([&](const Problem& p) { return zero_len(p.cu_seqlens_k); }));
  EXPECT_TRUE(any([](const Problem& p) { return p.seqlen_k == 1; }));
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) {
    EXPECT_TRUE(any([&](const Problem& p) { return p.dtype == d; })) << Name(d);
  }
  for (int64_t d : {40, 96}) {
    EXPECT_TRUE(any([&](const Problem& p) { return p.head_dim == d || p.head_dim_v == d; }));
  }
  EXPECT_TRUE(any([](const Problem& p) { return p.batch > 1 && !p.varlen(); }));
}

// --- Regen and verify on a scratch copy ------------------------------------------------------

constexpr const char* kCaseA = "causal_br_sq_gt_sk";  // has empty rows (lse = -inf)
constexpr const char* kCaseB = "varlen_zero_len_q";

GoldenRegenOptions Regen(const fs::path& dir, const char* only) {
  GoldenRegenOptions g;
  g.dir = dir;
  g.only = only;
  g.commit = "test";
  g.date = "2026-01-01T00:00:00Z";
  return g;
}

TEST(GoldenRegen, IsDeterministicAndVerifies) {
  TempDir a("a"), b("b");
  for (const char* name : {kCaseA, kCaseB}) {
    auto ra = RegenGolden(Regen(a.path(), name));
    ASSERT_TRUE(ra.ok()) << ra.error().message;
    ASSERT_TRUE(RegenGolden(Regen(b.path(), name)).ok());
  }
  for (const auto& entry : fs::directory_iterator(a.path())) {
    const fs::path other = b.path() / entry.path().filename();
    EXPECT_EQ(ReadAll(entry.path()), ReadAll(other)) << entry.path().filename();
  }
  // A second regen with another date leaves every byte (the manifest's too) unchanged.
  const std::string manifest = ReadAll(a.path() / "manifest.json");
  auto again = Regen(a.path(), kCaseA);
  again.date = "2030-01-01T00:00:00Z";
  auto report = RegenGolden(again);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->unchanged, std::vector<std::string>{kCaseA});
  EXPECT_EQ(ReadAll(a.path() / "manifest.json"), manifest);

  GoldenVerifyOptions v;
  v.dir = a.path();
  auto reports = VerifyGolden(v);
  ASSERT_TRUE(reports.ok()) << reports.error().message;
  ASSERT_EQ(reports->size(), 2u);
  for (const auto& r : *reports) {
    EXPECT_EQ(r.outcome, GoldenOutcome::kPass) << r.name;
    ASSERT_EQ(r.tensors.size(), std::size(kGoldenOutputTensors));
    for (const auto& t : r.tensors) {
      EXPECT_LE(t.max_abs_error, t.bound) << r.name << " " << t.tensor;
      EXPECT_GT(t.bound, 0) << r.name << " " << t.tensor;
    }
  }
  EXPECT_EQ(GoldenExitCode(*reports), 0);
}

// Rewrites tensor `tensor` of a safetensors file with fn applied to its f64 values, then
// records the new hash in the manifest (as a careless regen would).
template <class Fn>
void EditAndRehash(const fs::path& dir, const std::string& file, const std::string& tensor,
                   Fn fn) {
  auto st = ReadSafetensors((dir / file).string());
  ASSERT_TRUE(st.ok()) << st.error().message;
  for (auto& [name, t] : st->tensors) {
    if (name == tensor) fn(t);
  }
  ASSERT_TRUE(WriteSafetensors((dir / file).string(), *st).ok());
  auto m = LoadManifest(dir / "manifest.json");
  ASSERT_TRUE(m.ok());
  for (auto& e : m->cases) {
    if (e.sha256.contains(file)) e.sha256[file] = *Sha256File(dir / file);
  }
  ASSERT_TRUE(SaveManifest(dir / "manifest.json", *m).ok());
}

TEST(GoldenVerify, DriftInOneOutputValueIsAFindingNamingCaseAndTensor) {
  TempDir dir("drift");
  ASSERT_TRUE(RegenGolden(Regen(dir.path(), kCaseA)).ok());
  // One element of dk moved by 1e-9 of the tensor's scale: far below any kernel tolerance,
  // far above the oracle's certified bound.
  EditAndRehash(dir.path(), GoldenOutputsFile(kCaseA), "dk", [](Tensor& t) {
    auto s = t.span<double>();
    s[s.size() / 2] += 1e-9 * (1 + std::abs(s[s.size() / 2]));
  });
  GoldenVerifyOptions v;
  v.dir = dir.path();
  auto reports = VerifyGolden(v);
  ASSERT_TRUE(reports.ok());
  ASSERT_EQ(reports->size(), 1u);
  const auto& r = (*reports)[0];
  EXPECT_EQ(r.outcome, GoldenOutcome::kDrift);
  EXPECT_EQ(GoldenExitCode(*reports), 1);
  ASSERT_FALSE(r.messages.empty());
  EXPECT_NE(r.messages[0].find(std::string(kCaseA) + ": tensor dk"), std::string::npos)
      << r.messages[0];
  for (const auto& t : r.tensors) EXPECT_EQ(t.pass, t.tensor != "dk") << t.tensor;
}

TEST(GoldenVerify, EmptyRowLseMustStayMinusInfinity) {
  TempDir dir("lse");
  ASSERT_TRUE(RegenGolden(Regen(dir.path(), kCaseA)).ok());
  // Row 0 of head 0 sees no key (Sq = 48 > Sk = 20, bottom-right causal): lse = -inf there.
  EditAndRehash(dir.path(), GoldenOutputsFile(kCaseA), "lse", [](Tensor& t) {
    ASSERT_TRUE(std::isinf(t.span<double>()[0]));
    t.span<double>()[0] = -1e300;
  });
  GoldenVerifyOptions v;
  v.dir = dir.path();
  auto reports = VerifyGolden(v);
  ASSERT_TRUE(reports.ok());
  EXPECT_EQ((*reports)[0].outcome, GoldenOutcome::kDrift);
  EXPECT_NE((*reports)[0].messages[0].find("tensor lse"), std::string::npos);
}

TEST(GoldenVerify, InputsThatNoLongerReproduceAreDrift) {
  TempDir dir("inputs");
  ASSERT_TRUE(RegenGolden(Regen(dir.path(), kCaseB)).ok());
  // Swap two elements of q: still bf16 values, still a valid file, no longer the seed's.
  EditAndRehash(dir.path(), GoldenInputsFile(kCaseB), "q", [](Tensor& t) {
    auto s = t.span<uint16_t>();
    std::swap(s[0], s[1]);
  });
  // The case file's hash is unchanged; the inputs file was re-hashed.
  GoldenVerifyOptions v;
  v.dir = dir.path();
  auto reports = VerifyGolden(v);
  ASSERT_TRUE(reports.ok());
  EXPECT_EQ((*reports)[0].outcome, GoldenOutcome::kDrift);
  EXPECT_NE((*reports)[0].messages[0].find("tensor q: stored inputs differ"), std::string::npos)
      << (*reports)[0].messages[0];
}

TEST(GoldenVerify, CorruptOrMissingFilesAreInfrastructureErrors) {
  TempDir dir("corrupt");
  ASSERT_TRUE(RegenGolden(Regen(dir.path(), kCaseA)).ok());
  GoldenVerifyOptions v;
  v.dir = dir.path();
  {
    // One flipped byte in the outputs without a new hash.
    const fs::path out = dir.path() / GoldenOutputsFile(kCaseA);
    std::string bytes = ReadAll(out);
    bytes[bytes.size() - 3] ^= 0x10;
    std::ofstream(out, std::ios::binary | std::ios::trunc) << bytes;
    auto reports = VerifyGolden(v);
    ASSERT_TRUE(reports.ok());
    EXPECT_EQ((*reports)[0].outcome, GoldenOutcome::kBroken);
    EXPECT_EQ(GoldenExitCode(*reports), 2);
    EXPECT_NE((*reports)[0].messages[0].find("corrupt: sha256"), std::string::npos);
  }
  {
    fs::remove(dir.path() / GoldenInputsFile(kCaseA));
    auto reports = VerifyGolden(v);
    ASSERT_TRUE(reports.ok());
    EXPECT_EQ((*reports)[0].outcome, GoldenOutcome::kBroken);
    bool named = false;
    for (const auto& m : (*reports)[0].messages) named |= m.find("missing file") != m.npos;
    EXPECT_TRUE(named);
  }
  v.only = "no_such_case";
  EXPECT_FALSE(VerifyGolden(v).ok());
  fs::remove(dir.path() / "manifest.json");
  v.only.reset();
  EXPECT_FALSE(VerifyGolden(v).ok());
}


// --- The committed files against a naive implementation written here -----------------------

// Attention forward and backward straight from the definitions (docs/design.md "Semantics": the
// shared MaskView / TransformScore, softmax, D = rowsum(dO o O), dS = P o (dP - D), softcap
// chain rule), in long double with one score row at a time: independent of the oracle's
// tiling, BLAS and compensated sums, so a semantic slip in the oracle cannot also be pinned.
struct NaiveOut {
  std::vector<long double> o, lse, dq, dk, dv, delta;
};

NaiveOut Naive(const Problem& p, const CaseInputs& in) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  const long double scale = p.EffectiveScale();
  const auto q = in.q.span<const double>(), k = in.k.span<const double>(),
             v = in.v.span<const double>(), dout = in.dout.span<const double>();
  NaiveOut out;
  out.o.assign(in.q.numel() / d * dv, 0);
  out.lse.assign(static_cast<size_t>(Tensor::NumElements(p.LseShape())),
                 -std::numeric_limits<long double>::infinity());
  out.delta.assign(out.lse.size(), 0);
  out.dq.assign(q.size(), 0);
  out.dk.assign(k.size(), 0);
  out.dv.assign(v.size(), 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence& seq = mask.sequence();
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      for (int64_t i = 0; i < seq.q_len; ++i) {
        const int64_t qrow = ((seq.q_begin + i) * hq + h);
        const size_t lse_at = static_cast<size_t>(
            p.varlen() ? h * p.TotalQ() + seq.q_begin + i : (b * hq + h) * p.seqlen_q + i);
        std::vector<long double> s(static_cast<size_t>(seq.k_len)), x(s.size());
        std::vector<char> vis(s.size(), 0);
        long double m = -std::numeric_limits<long double>::infinity();
        for (int64_t j = 0; j < seq.k_len; ++j) {
          if (!mask.Visible(i, j)) continue;
          vis[j] = 1;
          const int64_t krow = (seq.k_begin + j) * hkv + g;
          long double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += (long double)q[qrow * d + c] * k[krow * d + c];
          x[j] = scale * dot;
          s[j] = TransformScore<long double>(x[j], p.softcap, slope, mask.AlibiDistance(i, j));
          m = std::max(m, s[j]);
        }
        if (std::isinf(m)) continue;  // empty row: o = 0, lse = -inf, dq = 0
        long double l = 0;
        for (int64_t j = 0; j < seq.k_len; ++j) {
          if (vis[j]) l += std::exp(s[j] - m);
        }
        out.lse[lse_at] = m + std::log(l);
        std::vector<long double> prob(s.size(), 0);
        for (int64_t j = 0; j < seq.k_len; ++j) {
          if (vis[j]) prob[j] = std::exp(s[j] - out.lse[lse_at]);
        }
        for (int64_t c = 0; c < dv; ++c) {
          long double acc = 0;
          for (int64_t j = 0; j < seq.k_len; ++j) {
            acc += prob[j] * v[((seq.k_begin + j) * hkv + g) * dv + c];
          }
          out.o[qrow * dv + c] = acc;
          out.delta[lse_at] += acc * dout[qrow * dv + c];
        }
        for (int64_t j = 0; j < seq.k_len; ++j) {
          if (!vis[j]) continue;
          const int64_t krow = (seq.k_begin + j) * hkv + g;
          long double dp = 0;
          for (int64_t c = 0; c < dv; ++c) {
            dp += (long double)dout[qrow * dv + c] * v[krow * dv + c];
            out.dv[krow * dv + c] += prob[j] * dout[qrow * dv + c];
          }
          long double ds = prob[j] * (dp - out.delta[lse_at]);
          if (p.softcap > 0) {
            const long double t = std::tanh(x[j] / p.softcap);
            ds *= 1 - t * t;
          }
          for (int64_t c = 0; c < d; ++c) {
            out.dq[qrow * d + c] += scale * ds * k[krow * d + c];
            out.dk[krow * d + c] += scale * ds * q[qrow * d + c];
          }
        }
      }
    }
  }
  return out;
}

TEST(GoldenFiles, MatchANaiveLongDoubleAttentionWrittenFromTheDefinitions) {
  const fs::path dir = fs::path(ATTEST_SOURCE_DIR) / "golden" / "cases";
  auto manifest = LoadManifest(dir / "manifest.json");
  ASSERT_TRUE(manifest.ok()) << manifest.error().message;
  ASSERT_GE(manifest->cases.size(), 30u);
  double observed = 0;  // max over cases and tensors of |naive - mp256| / scale
  std::string observed_at;
  for (const GoldenEntry& e : manifest->cases) {
    auto c = LoadCase(dir / GoldenCaseFile(e.name));
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto in = MakeCaseInputs(*c);
    ASSERT_TRUE(in.ok()) << in.error().message;
    auto stored = ReadSafetensors((dir / GoldenOutputsFile(e.name)).string());
    ASSERT_TRUE(stored.ok()) << stored.error().message;
    const NaiveOut naive = Naive(c->problem, *in);
    const std::pair<const char*, const std::vector<long double>*> tensors[] = {
        {"o", &naive.o},   {"lse", &naive.lse}, {"dq", &naive.dq},
        {"dk", &naive.dk}, {"dv", &naive.dv},   {"delta", &naive.delta}};
    for (const auto& [name, values] : tensors) {
      const Tensor* ref = stored->Find(name);
      ASSERT_NE(ref, nullptr) << e.name << " " << name;
      const auto r = ref->span<const double>();
      ASSERT_EQ(r.size(), values->size()) << e.name << " " << name;
      double scale = 0, worst = 0;
      for (double x : r) {
        if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
      }
      for (size_t n = 0; n < r.size(); ++n) {
        const long double a = (*values)[n];
        if (std::isinf(r[n]) || std::isinf(a)) {
          ASSERT_EQ(static_cast<double>(a), r[n]) << e.name << " " << name << " [" << n << "]";
          continue;
        }
        worst = std::max(worst, static_cast<double>(std::abs(a - (long double)r[n])));
      }
      // long double (u = 2^-64) against mp256: 1e-13 of the tensor's scale leaves room for
      // conditioning (|s| up to ~1e2 in huge_logits_bf16) and still catches any O(ulp) slip.
      EXPECT_LE(worst, 1e-13 * std::max(scale, 1e-300)) << e.name << " " << name;
      if (scale > 0 && worst / scale > observed) {
        observed = worst / scale;
        observed_at = e.name + " " + name;
      }
    }
  }
  std::printf("max |naive - mp256| / max|mp256| = %.3e (%s)\n", observed, observed_at.c_str());
}

}  // namespace
}  // namespace attest
