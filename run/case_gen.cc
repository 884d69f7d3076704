// Case generators and the deterministic shrinker (see case_gen.h).
#include "run/case_gen.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

#include "reference/problem/paged.h"

namespace attest {

size_t Picker::Weighted(std::initializer_list<int> weights) {
  const int total = std::accumulate(weights.begin(), weights.end(), 0);
  int r = static_cast<int>(Int(0, total - 1));
  size_t i = 0;
  for (int w : weights) {
    if (r < w) return i;
    r -= w;
    ++i;
  }
  return weights.size() - 1;
}

// Stream id of fuzz picks: far from the tensor and auxiliary streams of generate.h, so a
// fuzz seed used as a generator seed never reads the same words.
constexpr uint32_t kFuzzStream = 0x66757a7a;  // "fuzz"

int64_t PhiloxPicker::Int(int64_t lo, int64_t hi) {
  assert(lo <= hi);
  ElementStream s(seed_, kFuzzStream, count_++);
  const auto span = static_cast<uint64_t>(hi - lo) + 1;  // 0 means the full 2^64 range
  const uint64_t w = s.NextU64();
  if (span == 0) return static_cast<int64_t>(w);
  // floor(w * span / 2^64): integer-only, identical everywhere.
  return lo + static_cast<int64_t>((static_cast<unsigned __int128>(w) * span) >> 64);
}

double DrawBitPattern(Picker& pick, int emin, int emax, int mbits, bool allow_negative) {
  const double sign = allow_negative && pick.Chance(1, 2) ? -1.0 : 1.0;
  const int e = static_cast<int>(pick.Int(emin, emax));
  const int64_t m = mbits > 0 ? pick.Int(0, (int64_t{1} << mbits) - 1) : 0;
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -mbits), e);
}

std::vector<std::string> DomainGenerators() {
  return {"gaussian",           "uniform",       "outlier-channels", "heavy-tail",
          "token-scale-spread", "peaked-logits", "constant-rows",    "ties",
          "near-fp8-subnormal"};
}

namespace {

// Sequence lengths: tiny values, tile boundaries +-1, or anything up to `max`.
int64_t DrawSeqLen(Picker& pick, int64_t max, int64_t min = 1) {
  max = std::max(max, min);
  switch (pick.Weighted({3, 4, 3})) {
    case 0:
      return std::clamp<int64_t>(pick.Int(1, 8), min, max);
    case 1: {
      // One and two tiles: a second key tile is where tile-order and last-tile bugs live.
      std::vector<int64_t> tiles;
      for (int64_t t : kTileSizes) {
        for (int64_t k : {1, 2}) {
          if (k * t + 1 <= max) tiles.push_back(k * t);
        }
      }
      if (tiles.empty()) return pick.Int(min, max);
      return std::clamp<int64_t>(pick.Element(tiles) + pick.Int(-1, 1), min, max);
    }
    default:
      return pick.Int(min, max);
  }
}

int64_t DrawWindowBound(Picker& pick, int64_t sk) {
  switch (pick.Weighted({2, 1, 2, 1, 1})) {
    case 0:
      return -1;
    case 1:
      return 0;
    case 2:
      return pick.Int(1, 8);
    case 3:
      return std::max<int64_t>(0, pick.Element(std::vector<int64_t>{16, 32, 64}) + pick.Int(-1, 1));
    default:
      return sk + pick.Int(1, 16);  // wider than the sequence
  }
}

std::vector<int64_t> HeadDimChoices(const std::vector<int64_t>& listed, int64_t max_dim) {
  std::vector<int64_t> dims;
  if (listed.empty()) {
    dims = {16, 32, 64, 8, 40, 24, 96, 128};
  } else {
    dims = listed;
    std::sort(dims.begin(), dims.end());
  }
  std::vector<int64_t> out;
  for (int64_t d : dims) {
    if (d <= max_dim) out.push_back(d);
  }
  if (out.empty()) out.push_back(*std::min_element(dims.begin(), dims.end()));
  if (!listed.empty() && out.size() > 4) out.resize(4);  // the smallest few: fast cases
  return out;
}

// Sorted document ids of one row of `len` tokens split into `docs` documents at drawn cuts
// (equal cuts give zero-length documents).
std::vector<int32_t> DrawDocumentRow(Picker& pick, int64_t len, int64_t docs) {
  std::vector<int64_t> cuts;
  for (int64_t d = 0; d + 1 < docs; ++d) cuts.push_back(pick.Int(0, len));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int32_t> ids(static_cast<size_t>(len));
  size_t next = 0;
  int32_t doc = 0;
  for (int64_t i = 0; i < len; ++i) {
    while (next < cuts.size() && cuts[next] <= i) ++next, ++doc;
    ids[static_cast<size_t>(i)] = doc;
  }
  return ids;
}

std::vector<double> DrawAlibiSlopes(Picker& pick, int64_t heads) {
  std::vector<double> slopes;
  for (int64_t h = 0; h < heads; ++h) slopes.push_back(DrawBitPattern(pick, -10, -1, 3, false));
  return slopes;
}

}  // namespace

Problem DrawProblem(const Capabilities& caps, Picker& pick, const DrawLimits& limits) {
  Problem p;
  // 1. Element type and head dims from the kernel's lists.
  p.dtype = caps.dtypes.empty()
                ? pick.Element(std::vector<DType>{DType::kBF16, DType::kF16, DType::kF32})
                : pick.Element(caps.dtypes);
  const auto dims = HeadDimChoices(caps.head_dims, limits.max_head_dim);
  p.head_dim = dims[static_cast<size_t>(pick.Weighted({4, 3, 2, 1}) % dims.size())];
  if (caps.same_head_dim_v ||
      (pick.Chance(3, 4) &&
       (caps.head_dims_v.empty() || std::find(caps.head_dims_v.begin(), caps.head_dims_v.end(),
                                              p.head_dim) != caps.head_dims_v.end()))) {
    p.head_dim_v = p.head_dim;
  } else {
    p.head_dim_v = pick.Element(HeadDimChoices(caps.head_dims_v, limits.max_head_dim));
  }
  // 2. Heads: GQA ratios 1..max when claimed.
  p.heads_kv = pick.Int(1, limits.max_heads_kv);
  p.heads_q = caps.gqa ? p.heads_kv * pick.Int(1, limits.max_gqa_ratio) : p.heads_kv;
  // 3. Layout: packed documents (with zero-length ones), per-token documents, or padded.
  const size_t layout = pick.Weighted({6, caps.varlen ? 2 : 0, caps.documents ? 2 : 0});
  if (layout == 1) {
    p.batch = pick.Int(1, limits.max_documents);
    const int64_t per_doc = std::max<int64_t>(2, limits.max_seqlen / p.batch);
    std::vector<int32_t> cq{0}, ck{0};
    int64_t max_q = 0, max_k = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t lq = pick.Chance(1, 5) ? 0 : DrawSeqLen(pick, per_doc);
      const int64_t lk = pick.Chance(1, 5) ? 0 : DrawSeqLen(pick, per_doc);
      cq.push_back(static_cast<int32_t>(cq.back() + lq));
      ck.push_back(static_cast<int32_t>(ck.back() + lk));
      max_q = std::max(max_q, lq), max_k = std::max(max_k, lk);
    }
    // At least one token on each side, so that the tensors are not empty.
    if (cq.back() == 0) {
      for (auto& c : cq) c += (&c == &cq.front()) ? 0 : 1;
      max_q = std::max<int64_t>(max_q, 1);
    }
    if (ck.back() == 0) {
      for (auto& c : ck) c += (&c == &ck.front()) ? 0 : 1;
      max_k = std::max<int64_t>(max_k, 1);
    }
    p.cu_seqlens_q = cq;
    p.cu_seqlens_k = ck;
    p.seqlen_q = max_q;
    p.seqlen_k = max_k;
  } else {
    p.batch = pick.Weighted({4, 2, 1}) + 1;
    p.batch = std::min(p.batch, limits.max_batch);
    p.seqlen_q = DrawSeqLen(pick, limits.max_seqlen);
    p.seqlen_k = pick.Chance(1, 4) ? p.seqlen_q : DrawSeqLen(pick, limits.max_seqlen);
    if (layout == 2) {
      const int64_t docs = pick.Int(1, limits.max_documents);
      std::vector<std::vector<int32_t>> iq, ik;
      for (int64_t b = 0; b < p.batch; ++b) {
        iq.push_back(DrawDocumentRow(pick, p.seqlen_q, docs));
        ik.push_back(DrawDocumentRow(pick, p.seqlen_k, docs));
      }
      p.document_ids_q = iq;
      p.document_ids_k = ik;
    }
  }
  // 4. Mask: none, causal (both alignments), window, prefix-LM. A kernel whose diagonal rules
  // are top-left only (kernel.h causal_top_left_only) gets them top-left (after the draw, so
  // that every other kernel's draws stay as they were).
  const bool can_prefix = caps.prefix_lm && caps.causal;
  switch (pick.Weighted(
      {3, caps.causal ? 3 : 0, caps.causal && !caps.causal_bottom_right_only ? 1 : 0,
       caps.window ? 3 : 0, can_prefix ? 1 : 0})) {
    case 1:
      p.causal = true;
      break;
    case 2:
      p.causal = true;
      p.causal_align = CausalAlign::kTopLeft;
      break;
    case 3:
      p.window_left = DrawWindowBound(pick, p.seqlen_k);
      p.window_right = DrawWindowBound(pick, p.seqlen_k);
      if (p.window_left < 0 && p.window_right < 0) p.window_left = pick.Int(0, p.seqlen_k + 2);
      if (caps.causal && pick.Chance(1, 3)) p.causal = true;
      break;
    case 4:
      p.causal = true;
      p.prefix_lm = pick.Int(1, std::max<int64_t>(1, p.seqlen_k));
      break;
    default:
      break;
  }
  if (caps.causal_top_left_only) p.causal_align = CausalAlign::kTopLeft;
  // Block-sparse lists (FlexAttention block masks), AND-ed with the mask above: each
  // (query block, key block) pair listed with probability 1/2, so some rows see nothing.
  if (caps.block_sparse && pick.Chance(1, 6)) {
    BlockSparse bs;
    bs.block_q = pick.Element(std::vector<int64_t>{16, 32, 64});
    bs.block_k = pick.Element(std::vector<int64_t>{16, 32, 64});
    const int64_t nq = (p.seqlen_q + bs.block_q - 1) / bs.block_q;
    const int64_t nk = (p.seqlen_k + bs.block_k - 1) / bs.block_k;
    for (int64_t qb = 0; qb < nq; ++qb) {
      for (int64_t kb = 0; kb < nk; ++kb) {
        if (pick.Chance(1, 2)) bs.blocks.emplace_back(qb, kb);
      }
    }
    p.block_sparse = bs;
  }
  // A kernel's shape limits (kernels/shape_limits.h): the drawn lengths moved to the nearest
  // legal ones (rounded up to the kernel's block, equalised, capped), which keeps the draw's
  // bias toward one and two tiles, now of the kernel's own block.
  // The draw's own length bound stays a bound where the kernel's block fits under it.
  if (caps.shapes.any()) {
    ShapeLimits s = caps.shapes;
    auto cap = [&](int64_t& max, int64_t multiple) {
      const int64_t under = limits.max_seqlen / multiple * multiple;
      if (under >= multiple && (max == 0 || under < max)) max = under;
    };
    cap(s.max_seqlen_q, s.equal_seqlens ? std::lcm(s.seqlen_q_multiple, s.seqlen_k_multiple)
                                        : s.seqlen_q_multiple);
    cap(s.max_seqlen_k, s.equal_seqlens ? std::lcm(s.seqlen_q_multiple, s.seqlen_k_multiple)
                                        : s.seqlen_k_multiple);
    const Problem drawn = p;
    std::string why = FitShape(p, s, kAnyShape);
    if (!why.empty()) {  // a minimum above the draw's bound: the kernel's own limits alone
      p = drawn;
      why = FitShape(p, caps.shapes, kAnyShape);
    }
    assert(why.empty());
  }
  // 5. Score modifiers, from bit patterns: softcap in [1, 120), ALiBi slopes in [2^-10, 1),
  // an explicit scale in [2^-6, 2).
  if (caps.softcap && pick.Chance(1, 4)) p.softcap = DrawBitPattern(pick, 0, 6, 2, false);
  if (caps.alibi && pick.Chance(1, 4)) p.alibi_slopes = DrawAlibiSlopes(pick, p.heads_q);
  if (pick.Chance(1, 6)) p.scale = DrawBitPattern(pick, -6, 0, 4, false);
  // 6. A learnable sink, only for kernels that claim one (so no other kernel's draws move).
  if (caps.sink && pick.Chance(1, 4)) p.sink = true;
  // 7. A learnable relative bias, only for kernels that claim one (likewise).
  if (caps.rel_bias && pick.Chance(1, 4)) p.rel_bias = true;
  return p;
}

GeneratorSpec DrawGenerator(const Problem& p, Picker& pick, const DrawLimits& limits) {
  const std::vector<std::string> names =
      limits.generators.empty() ? DomainGenerators() : limits.generators;
  GeneratorSpec g;
  // Gaussian half the time, the other rows share the rest.
  g.name = pick.Chance(1, 2) ? names.front() : pick.Element(names);
  g.seed = static_cast<uint64_t>(pick.Int(0, (int64_t{1} << 40) - 1));
  nlohmann::json params = nlohmann::json::object();
  auto choose = [&](const std::vector<double>& xs) { return pick.Element(xs); };
  if (g.name == "gaussian") {
    if (pick.Chance(1, 2)) params["std"] = choose({0.5, 2.0, 4.0});
    if (pick.Chance(1, 4)) params["q"] = {{"std", choose({2.0, 4.0, 8.0})}};
  } else if (g.name == "outlier-channels") {
    params["scale"] = choose({8.0, 20.0});
    params["count"] = choose({1.0, 2.0, 4.0});
  } else if (g.name == "heavy-tail") {
    params["dof"] = choose({3.0, 4.0, 6.0});
  } else if (g.name == "token-scale-spread") {
    params["decades"] = choose({1.0, 2.0, 3.0});
  } else if (g.name == "peaked-logits") {
    params["gain"] = choose({2.0, 4.0});
  } else if (g.name == "near-fp8-subnormal") {
    params["format"] = pick.Chance(1, 2) ? "e4m3fn" : "e5m2";
  } else if (g.name == "near-max") {
    params["format"] = pick.Chance(1, 2) ? "e4m3fn" : "e5m2";
  } else if (g.name == "ties") {
    params["group"] = choose({1.0, 2.0, 4.0});
  }
  // A sink's logits (docs/semantics.md section 7): below, near and well above a row's keys.
  if (p.sink) params["sink"] = {{"mean", choose({0.0, 2.5, 6.0})}, {"std", 1.0}};
  // A relative-bias table (section 7): small against the scores, or as large as they are.
  if (p.rel_bias) params["rel_bias"] = {{"std", choose({0.5, 2.0})}};
  g.params = params;
  return g;
}

Case DrawCase(const Capabilities& caps, Picker& pick, const DrawLimits& limits) {
  Case c;
  c.problem = DrawProblem(caps, pick, limits);
  c.generator = DrawGenerator(c.problem, pick, limits);
  assert(Validate(c.problem).ok());
  assert(caps.Covers(c.problem));
  return c;
}

// ---- Shrinking --------------------------------------------------------------------------

int64_t CaseComplexity(const Case& c) {
  const Problem& p = c.problem;
  int64_t n = p.TotalQ() + p.TotalK() + 8 * p.batch + 4 * (p.heads_q + p.heads_kv) + p.head_dim +
              p.head_dim_v;
  n += 16 *
       (p.causal + (p.causal_align == CausalAlign::kTopLeft) + (p.window_left >= 0) +
        (p.window_right >= 0) + (p.softcap > 0) + p.alibi_slopes.has_value() + p.scale.has_value() +
        (p.prefix_lm > 0) + p.document_ids_q.has_value() + p.varlen() + p.block_sparse.has_value());
  if (p.document_ids_q) {
    for (const auto& row : *p.document_ids_q) n += row.empty() ? 0 : row.back();
    for (const auto& row : *p.document_ids_k) n += row.empty() ? 0 : row.back();
  }
  if (c.generator) {
    n += 4 * (c.generator->name != "gaussian") + 2 * !c.generator->params.empty();
  }
  return n;
}

namespace {


// Resizes a padded problem's sequence axis (document ids follow, truncated or extended with
// the last id).
void ResizePadded(Problem& p, int64_t sq, int64_t sk) {
  auto fit = [](std::vector<std::vector<int32_t>>& rows, int64_t len) {
    for (auto& row : rows) {
      const int32_t last = row.empty() ? 0 : row.back();
      row.resize(static_cast<size_t>(len), last);
    }
  };
  if (p.document_ids_q) fit(*p.document_ids_q, sq);
  if (p.document_ids_k) fit(*p.document_ids_k, sk);
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  DropBlocksPastLengths(p);
}

// Packed problem from per-sequence lengths.
void SetPacked(Problem& p, const std::vector<int64_t>& lq, const std::vector<int64_t>& lk) {
  std::vector<int32_t> cq{0}, ck{0};
  for (size_t b = 0; b < lq.size(); ++b) {
    cq.push_back(static_cast<int32_t>(cq.back() + lq[b]));
    ck.push_back(static_cast<int32_t>(ck.back() + lk[b]));
  }
  p.batch = static_cast<int64_t>(lq.size());
  p.cu_seqlens_q = cq;
  p.cu_seqlens_k = ck;
  p.seqlen_q = std::max<int64_t>(1, *std::max_element(lq.begin(), lq.end()));
  p.seqlen_k = std::max<int64_t>(1, *std::max_element(lk.begin(), lk.end()));
  DropBlocksPastLengths(p);
}

void SetHeads(Problem& p, int64_t hq, int64_t hkv) {
  p.heads_q = hq;
  p.heads_kv = hkv;
  if (p.alibi_slopes) p.alibi_slopes->resize(static_cast<size_t>(hq), 0.5);
}

}  // namespace

std::vector<Case> ShrinkCandidates(const Case& c, const Capabilities& caps) {
  std::vector<Case> out;
  const Problem& p0 = c.problem;
  auto add = [&](auto edit) {
    Case n = c;
    edit(n.problem, n);
    out.push_back(std::move(n));
  };
  // 1. Fewer batch entries / documents.
  if (p0.varlen()) {
    std::vector<int64_t> lq, lk;
    for (int64_t b = 0; b < p0.batch; ++b) {
      const Sequence s = SequenceOf(p0, b);
      lq.push_back(s.q_len);
      lk.push_back(s.k_len);
    }
    if (p0.batch == 1 && lq[0] > 0 && lk[0] > 0) {
      add([&](Problem& p, Case&) {
        p.cu_seqlens_q.reset();
        p.cu_seqlens_k.reset();
        p.seqlen_q = lq[0];
        p.seqlen_k = lk[0];
        DropBlocksPastLengths(p);
      });
    }
    for (size_t drop = 0; drop < lq.size() && lq.size() > 1; ++drop) {
      auto q = lq, k = lk;
      q.erase(q.begin() + static_cast<std::ptrdiff_t>(drop));
      k.erase(k.begin() + static_cast<std::ptrdiff_t>(drop));
      if (std::accumulate(q.begin(), q.end(), int64_t{0}) == 0 ||
          std::accumulate(k.begin(), k.end(), int64_t{0}) == 0) {
        continue;
      }
      add([&](Problem& p, Case&) { SetPacked(p, q, k); });
    }
    // Shorter sequences: halve, then minus one, each sequence's q or k side.
    for (size_t b = 0; b < lq.size(); ++b) {
      for (int side = 0; side < 2; ++side) {
        const int64_t len = side == 0 ? lq[b] : lk[b];
        for (int64_t to : {len / 2, len * 3 / 4, len - 1}) {
          if (to < 0 || to == len) continue;
          auto q = lq, k = lk;
          (side == 0 ? q : k)[b] = to;
          if (std::accumulate(q.begin(), q.end(), int64_t{0}) == 0 ||
              std::accumulate(k.begin(), k.end(), int64_t{0}) == 0) {
            continue;
          }
          add([&](Problem& p, Case&) { SetPacked(p, q, k); });
        }
      }
    }
  } else {
    if (p0.batch > 1) {
      add([&](Problem& p, Case&) {
        p.batch = 1;
        if (p.document_ids_q) p.document_ids_q->resize(1), p.document_ids_k->resize(1);
      });
    }
    if (p0.document_ids_q) {
      add([&](Problem& p, Case&) {
        p.document_ids_q.reset();
        p.document_ids_k.reset();
      });
    }
    // Halve, three quarters (progress when half loses the failure), minus one.
    for (int64_t sq : {p0.seqlen_q / 2, p0.seqlen_q * 3 / 4, p0.seqlen_q - 1}) {
      if (sq >= 1 && sq < p0.seqlen_q)
        add([&](Problem& p, Case&) { ResizePadded(p, sq, p.seqlen_k); });
    }
    for (int64_t sk : {p0.seqlen_k / 2, p0.seqlen_k * 3 / 4, p0.seqlen_k - 1}) {
      if (sk >= 1 && sk < p0.seqlen_k)
        add([&](Problem& p, Case&) { ResizePadded(p, p.seqlen_q, sk); });
    }
    if (p0.seqlen_q > 1 && p0.seqlen_k > 1) {
      add([&](Problem& p, Case&) { ResizePadded(p, p.seqlen_q / 2, p.seqlen_k / 2); });
    }
  }
  // 2. Fewer heads.
  if (p0.heads_kv > 1) add([&](Problem& p, Case&) { SetHeads(p, p.gqa_ratio(), 1); });
  if (p0.heads_q > p0.heads_kv)
    add([&](Problem& p, Case&) { SetHeads(p, p.heads_kv, p.heads_kv); });
  if (p0.gqa_ratio() > 2) add([&](Problem& p, Case&) { SetHeads(p, 2 * p.heads_kv, p.heads_kv); });
  // 3. Smaller head dims (the kernel's smaller listed dims, or halving).
  for (int64_t d : HeadDimChoices(caps.head_dims, p0.head_dim - 1)) {
    if (d < p0.head_dim) {
      add([&](Problem& p, Case&) {
        if (p.head_dim_v == p.head_dim) p.head_dim_v = d;
        p.head_dim = d;
      });
      break;
    }
  }
  if (p0.head_dim_v != p0.head_dim) add([&](Problem& p, Case&) { p.head_dim_v = p.head_dim; });
  // 4. Fewer mask and score features.
  if (p0.softcap > 0) add([](Problem& p, Case&) { p.softcap = 0; });
  if (p0.alibi_slopes) add([](Problem& p, Case&) { p.alibi_slopes.reset(); });
  if (p0.scale) add([](Problem& p, Case&) { p.scale.reset(); });
  if (p0.prefix_lm > 0) add([](Problem& p, Case&) { p.prefix_lm = 0; });
  if (p0.block_sparse) add([](Problem& p, Case&) { p.block_sparse.reset(); });
  if (p0.window_left >= 0 || p0.window_right >= 0) {
    add([](Problem& p, Case&) { p.window_left = p.window_right = -1; });
    if (p0.window_left >= 0 && p0.window_right >= 0) {
      add([](Problem& p, Case&) { p.window_right = -1; });
      add([](Problem& p, Case&) { p.window_left = -1; });
    }
  }
  if (p0.causal) {
    add([](Problem& p, Case&) {
      p.causal = false;
      p.causal_align = CausalAlign::kBottomRight;
      p.prefix_lm = 0;
    });
    if (p0.causal_align == CausalAlign::kTopLeft) {
      add([](Problem& p, Case&) { p.causal_align = CausalAlign::kBottomRight; });
    }
  }
  // 5. A plainer distribution on the same seed.
  if (c.generator && (c.generator->name != "gaussian" || !c.generator->params.empty())) {
    add([](Problem&, Case& n) {
      n.generator->name = "gaussian";
      n.generator->params = nlohmann::json::object();
    });
  }
  // Keep the valid, covered, strictly simpler ones.
  const int64_t before = CaseComplexity(c);
  std::vector<Case> kept;
  for (Case& n : out) {
    RepageAfterResize(n.problem);
    // Under shape limits a shorter length is moved to a legal one (halving 192 under a block of
    // 64 gives 96, moved to 128); candidates that do not get simpler are dropped below.
    if (caps.shapes.any() && !FitShape(n.problem, caps.shapes, kAnyShape).empty()) continue;
    if (!Validate(n.problem).ok() || !caps.Covers(n.problem)) continue;
    if (CaseComplexity(n) >= before) continue;
    kept.push_back(std::move(n));
  }
  return kept;
}

void DrawPaging(const Capabilities& caps, Picker& pick, Problem& p) {
  if ((!caps.paged && !caps.seqused) || p.document_ids_q || !pick.Chance(1, 2)) return;
  if (caps.paged) p.page_size = pick.Element(std::vector<int64_t>{1, 3, 16});
  if (caps.seqused && pick.Chance(2, 3)) {
    std::vector<int32_t> used_q, used_k;
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence s = SequenceOf(p, b);
      used_q.push_back(static_cast<int32_t>(pick.Chance(1, 2) ? s.q_len : pick.Int(0, s.q_len)));
      used_k.push_back(static_cast<int32_t>(pick.Int(0, s.k_len)));
    }
    p.seqused_q = std::move(used_q);
    p.seqused_k = std::move(used_k);
  }
  FillPagedDefaults(p);
}

void RepageAfterResize(Problem& p) {
  if (!HasLogicalView(p)) return;
  for (auto* used : {&p.seqused_q, &p.seqused_k}) {
    if (!*used) continue;
    if (static_cast<int64_t>((*used)->size()) != p.batch) {
      used->reset();
      continue;
    }
    for (int64_t b = 0; b < p.batch; ++b) {
      const Sequence s = SequenceOf(p, b);
      int32_t& u = (**used)[static_cast<size_t>(b)];
      u = static_cast<int32_t>(std::min<int64_t>(u, used == &p.seqused_q ? s.q_len : s.k_len));
    }
  }
  if (p.paged()) {
    p.num_pages = 0;
    p.page_table.reset();
    FillPagedDefaults(p);
  }
}

ShrinkResult Shrink(const Case& c, const Capabilities& caps,
                    const std::function<bool(const Case&)>& fails, int max_attempts) {
  ShrinkResult r{c, 0, 0};
  bool progress = true;
  while (progress && r.attempts < max_attempts) {
    progress = false;
    for (const Case& n : ShrinkCandidates(r.c, caps)) {
      if (r.attempts >= max_attempts) break;
      ++r.attempts;
      if (fails(n)) {
        r.c = n;
        ++r.steps;
        progress = true;
        break;
      }
    }
  }
  return r;
}

}  // namespace attest
