// The same-precision "pt" reference (see baseline.h for the rounding points and sources).
#include "verify/tolerance/baseline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "reference/formats/format.h"
#include "reference/oracle/oracle_internal.h"
#include "reference/problem/mask.h"
#include "reference/problem/tile_walk.h"

namespace attest {
namespace {

std::vector<float> ToFloats(const Tensor& t) {
  const Tensor c = ToF64(t);
  std::vector<float> out(static_cast<size_t>(c.numel()));
  const double* src = c.data<double>();
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(src[k]);
  return out;
}

Tensor FromFloats(const Shape& shape, const std::vector<float>& values) {
  std::vector<double> d(values.begin(), values.end());
  return Tensor::FromF64(shape, std::move(d));
}

// query_rows (forward only): compute only the flagged rows ([total_q] flags; verify/metrics/sample.h),
// one row at a time (O(Sk) memory instead of O(Sq x Sk)); the other rows stay o = 0, lse =
// -inf. A computed row is bitwise the whole run's: the same operations in the same order
// (scores outside the row's key bounds are never read, so they are not computed).
//
// threads (0: all cores): every element's operations and their order are the documented ones
// whatever the count, so the result is bitwise the same for any count. The forward runs its
// query rows in parallel (each row's outputs are its own); the backward takes blocks of
// kRowBlock rows: their dP, dS and dq rows in parallel, then dk and dv in parallel over key
// chunks, each key's sums running over the block's rows in order (sequential in i, as before).
constexpr int64_t kRowBlock = 64;
constexpr int64_t kKeyChunk = 512;

Expected<BaselineOut> Run(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor* dout, BaselineMode mode,
                          const std::vector<uint8_t>* query_rows = nullptr, int threads = 1) {
  if (Status s = Validate(p); !s.ok()) return s.error();
  if (Status s = ValidateInputShapes(p, q, k, v, dout); !s.ok()) return s.error();
  const auto format = FormatOf(p.dtype);
  if (!format || (*format != Format::kF32 && *format != Format::kBF16 && *format != Format::kF16)) {
    return Error{
        fmt::format("baseline: no same-precision (PyTorch math path) reference for "
                    "dtype {}; profiles for it do not use a baseline ratio",
                    Name(p.dtype))};
  }
  const Format f = *format;
  // R(): an output rounded once to the dtype; Ri(): the same for an intermediate tensor op,
  // which only the every-op mode rounds (the SDPA math backend keeps intermediates in fp32).
  const auto R = [f](float x) -> float {
    return f == Format::kF32 ? x : static_cast<float>(RoundTo(static_cast<double>(x), f));
  };
  const bool every_op = mode == BaselineMode::kEveryOp;
  const auto Ri = [&](float x) -> float { return every_op ? R(x) : x; };
  const bool backward = dout != nullptr;
  if (query_rows != nullptr &&
      (backward || static_cast<int64_t>(query_rows->size()) != p.TotalQ())) {
    return Error{"baseline: sampled rows need a forward and one flag per query row"};
  }
  const bool rowwise = query_rows != nullptr;
  const int workers = oracle_internal::ThreadCount(threads);
  const auto parallel = [threads](int64_t items, const std::function<void(int64_t, int)>& fn) {
    oracle_internal::ParallelFor(items, oracle_internal::ThreadCount(threads, items), fn);
  };
  // fn(j0, j1) over [0, n) in chunks of kKeyChunk, in parallel.
  const auto chunked = [&](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    parallel((n + kKeyChunk - 1) / kKeyChunk, [&](int64_t c, int) {
      fn(c * kKeyChunk, std::min(n, (c + 1) * kKeyChunk));
    });
  };
  const int64_t H = p.heads_q, Hk = p.heads_kv, D = p.head_dim, Dv = p.head_dim_v;
  const int64_t TQ = p.TotalQ(), TK = p.TotalK();
  const std::vector<float> qf = ToFloats(q), kf = ToFloats(k), vf = ToFloats(v);
  const std::vector<float> dof = backward ? ToFloats(*dout) : std::vector<float>{};
  const bool default_scale = !p.scale.has_value();
  const auto scale_f = static_cast<float>(p.EffectiveScale());
  const float sqrt_d = std::sqrt(static_cast<float>(D));
  const auto cap = static_cast<float>(p.softcap);
  const bool alibi = p.alibi_slopes.has_value();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  std::vector<float> o(static_cast<size_t>(TQ * H * Dv), 0.0f);
  std::vector<float> lse(static_cast<size_t>(TQ * H), kNegInf);
  std::vector<float> dq, dk, dv;
  if (backward) {
    dq.assign(static_cast<size_t>(TQ * H * D), 0.0f);
    dk.assign(static_cast<size_t>(TK * Hk * D), 0.0f);
    dv.assign(static_cast<size_t>(TK * Hk * Dv), 0.0f);
  }
  const auto lse_at = [&](int64_t b, int64_t h, int64_t t, int64_t i) -> float& {
    // [B, H, Sq] padded; [H, total_q] packed.
    const int64_t off = p.varlen() ? h * TQ + t : (b * H + h) * p.seqlen_q + i;
    return lse[static_cast<size_t>(off)];
  };

  // Per-worker buffers: a row's scores (s, s32), an output row's sums (acc_d) and, row-wise,
  // the row's visibility, probabilities and tanh values.
  struct Scratch {
    int64_t batch = -1;  // the sequence the buffers are sized for
    std::vector<float> s, s32, acc_d, pr, p32, th;
    std::vector<uint8_t> vis;
  };
  std::vector<Scratch> scratch(static_cast<size_t>(workers));  // sized on first use

  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence seq = mask.sequence();
    const int64_t nq = seq.q_len, nk = seq.k_len;
    const auto ready = [&](int worker) -> Scratch& {
      Scratch& w = scratch[static_cast<size_t>(worker)];
      if (w.batch == b) return w;
      w.batch = b;
      w.s.assign(static_cast<size_t>(nk), 0.0f);
      w.s32.assign(static_cast<size_t>(nk), 0.0f);
      w.acc_d.assign(static_cast<size_t>(std::max(D, Dv)), 0.0f);
      if (rowwise) {
        w.pr.assign(static_cast<size_t>(nk), 0.0f);
        w.vis.assign(static_cast<size_t>(nk), 0);
        if (alibi) w.p32.assign(static_cast<size_t>(nk), 0.0f);
        if (cap > 0) w.th.assign(static_cast<size_t>(nk), 0.0f);
      }
      return w;
    };
    // Per-head buffers, reused: scaled q', softmax output (rounded, and fp32 for ALiBi),
    // tanh values for the softcap backward, visibility (whole runs; row-wise they are the
    // workers' rows).
    std::vector<float> qs(static_cast<size_t>(nq * D));
    const int64_t area = rowwise ? 0 : nq * nk;
    std::vector<float> pr(static_cast<size_t>(area)), p32, th;
    std::vector<uint8_t> vis(static_cast<size_t>(area));
    if (!rowwise) TileVisibility(mask, 0, nq, 0, nk, vis);  // the same for every head
    std::vector<float> dk_acc(static_cast<size_t>(nk * D)), dv_acc(static_cast<size_t>(nk * Dv));
    std::vector<float> dk_group(static_cast<size_t>(nk * D)),
        dv_group(static_cast<size_t>(nk * Dv));
    if (alibi) p32.assign(static_cast<size_t>(area), 0.0f);
    if (cap > 0) th.assign(static_cast<size_t>(area), 0.0f);
    // dS of a block of rows (backward).
    std::vector<float> dsb(backward ? static_cast<size_t>(std::min(nq, kRowBlock) * nk) : 0);
    // Per-head copies of k and v in both orientations, so that every sum below runs over
    // contiguous memory with independent accumulators per output element (vectorisable while
    // each element's own sum stays sequential in its index, the order documented above).
    std::vector<float> kh(static_cast<size_t>(nk * D)), kt(static_cast<size_t>(D * nk));
    std::vector<float> vh(static_cast<size_t>(nk * Dv)), vt(static_cast<size_t>(Dv * nk));
    std::vector<float> qs32(static_cast<size_t>(nq * D));
    int64_t loaded_kv = -1;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = p.KvHead(h);
      const float slope = alibi ? static_cast<float>((*p.alibi_slopes)[static_cast<size_t>(h)]) : 0;
      const auto qrow = [&](int64_t i) {
        return &qf[static_cast<size_t>(((seq.q_begin + i) * H + h) * D)];
      };
      const auto dorow = [&](int64_t i) {
        return &dof[static_cast<size_t>(((seq.q_begin + i) * H + h) * Dv)];
      };
      if (hk != loaded_kv) {
        chunked(nk, [&](int64_t j0, int64_t j1) {
          for (int64_t j = j0; j < j1; ++j) {
            const float* kr = &kf[static_cast<size_t>(((seq.k_begin + j) * Hk + hk) * D)];
            const float* vr = &vf[static_cast<size_t>(((seq.k_begin + j) * Hk + hk) * Dv)];
            for (int64_t d = 0; d < D; ++d) {
              kh[static_cast<size_t>(j * D + d)] = kr[d];
              kt[static_cast<size_t>(d * nk + j)] = kr[d];
            }
            for (int64_t e = 0; e < Dv; ++e) {
              vh[static_cast<size_t>(j * Dv + e)] = vr[e];
              vt[static_cast<size_t>(e * nk + j)] = vr[e];
            }
          }
        });
        loaded_kv = hk;
      }
      // q' (dtype-rounded in every-op mode) and its fp32 counterpart for lse.
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          const float x = qrow(i)[d];
          const float x32 = default_scale ? x / sqrt_d : x * scale_f;
          qs32[static_cast<size_t>(i * D + d)] = x32;
          qs[static_cast<size_t>(i * D + d)] = Ri(x32);
        }
      }
      std::fill(pr.begin(), pr.end(), 0.0f);
      // ---- forward: one row at a time, rows in parallel ----
      parallel(nq, [&](int64_t i, int worker) {
        Scratch& w = ready(worker);
        std::vector<float>& s = w.s;
        std::vector<float>& s32 = w.s32;
        const int64_t t = seq.q_begin + i;
        if (rowwise && !(*query_rows)[static_cast<size_t>(t)]) return;
        // Row i's visibility, probabilities, fp32 probabilities and tanh values; and the keys
        // whose scores are read.
        uint8_t* vis_i = rowwise ? w.vis.data() : vis.data() + i * nk;
        float* pr_i = rowwise ? w.pr.data() : pr.data() + i * nk;
        float* p32_i = !alibi ? nullptr : rowwise ? w.p32.data() : p32.data() + i * nk;
        float* th_i = cap <= 0 ? nullptr : rowwise ? w.th.data() : th.data() + i * nk;
        int64_t j_lo = 0, j_hi = nk;
        if (rowwise) {
          std::tie(j_lo, j_hi) = mask.KeyBounds(i);
          RowVisibility(mask, i, 0, nk, vis_i);
        }
        // Raw scores of row i against every key: s_j = sum_d q'_d k_jd, sequential in d.
        std::fill(s.begin(), s.end(), 0.0f);
        for (int64_t d = 0; d < D; ++d) {
          const float a = qs[static_cast<size_t>(i * D + d)];
          const float* kd = kt.data() + d * nk;
          for (int64_t j = j_lo; j < j_hi; ++j) s[static_cast<size_t>(j)] += a * kd[j];
        }
        if (every_op) {
          std::fill(s32.begin(), s32.end(), 0.0f);
          for (int64_t d = 0; d < D; ++d) {
            const float a = qs32[static_cast<size_t>(i * D + d)];
            const float* kd = kt.data() + d * nk;
            for (int64_t j = j_lo; j < j_hi; ++j) s32[static_cast<size_t>(j)] += a * kd[j];
          }
        } else {
          s32 = s;  // the SDPA math path's scores are the fp32 ones
        }
        float m = kNegInf, m32 = kNegInf;
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis_i[j]) continue;
          float sj = Ri(s[static_cast<size_t>(j)]);
          float sj32 = s32[static_cast<size_t>(j)];
          if (cap > 0) {
            const float tj = Ri(std::tanh(Ri(sj / cap)));
            th_i[j] = tj;
            sj = Ri(tj * cap);
            sj32 = cap * std::tanh(sj32 / cap);
          }
          if (alibi) {
            const float bias = -slope * static_cast<float>(mask.AlibiDistance(i, j));
            sj = sj + bias;  // fp32 result: the bias tensor promotes the scores
            sj32 = sj32 + bias;
          }
          s[static_cast<size_t>(j)] = sj;
          s32[static_cast<size_t>(j)] = sj32;
          m = std::max(m, sj);
          m32 = std::max(m32, sj32);
        }
        if (m == kNegInf) return;  // empty row: p = 0, o = 0, lse = -inf
        float sum = 0, sum32 = 0;
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis_i[j]) continue;
          const float e = std::exp(s[static_cast<size_t>(j)] - m);
          s[static_cast<size_t>(j)] = e;
          sum += e;
          sum32 += std::exp(s32[static_cast<size_t>(j)] - m32);
        }
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis_i[j]) continue;
          const float pj = s[static_cast<size_t>(j)] / sum;
          if (alibi) p32_i[j] = pj;
          pr_i[j] = Ri(pj);
        }
        lse_at(b, h, t, i) = m32 + std::log(sum32);
        // o_e = sum_j p_j v_je, sequential in j (masked keys add exact zeros: skipped).
        std::vector<float>& acc_d = w.acc_d;
        std::fill(acc_d.begin(), acc_d.begin() + Dv, 0.0f);
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis_i[j]) continue;
          const float pj = pr_i[j];
          const float* vr = &vh[static_cast<size_t>(j * Dv)];
          for (int64_t e = 0; e < Dv; ++e) acc_d[static_cast<size_t>(e)] += pj * vr[e];
        }
        for (int64_t e = 0; e < Dv; ++e) {
          o[static_cast<size_t>((t * H + h) * Dv + e)] = R(acc_d[static_cast<size_t>(e)]);
        }
      });
      if (!backward) continue;
      // ---- backward ----
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      const std::vector<float>& pout = alibi ? p32 : pr;
      for (int64_t i0 = 0; i0 < nq; i0 += kRowBlock) {
        const int64_t i1 = std::min(nq, i0 + kRowBlock);
        parallel(i1 - i0, [&](int64_t r, int worker) {
          const int64_t i = i0 + r;
          const int64_t t = seq.q_begin + i;
          const float* g = dorow(i);
          float* ds = dsb.data() + r * nk;
          // dP_j = sum_e dO_e v_je (sequential in e), then the softmax backward from its
          // (rounded, or fp32 with ALiBi) output.
          std::fill(ds, ds + nk, 0.0f);
          for (int64_t e = 0; e < Dv; ++e) {
            const float a = g[e];
            const float* ve = vt.data() + e * nk;
            for (int64_t j = 0; j < nk; ++j) ds[j] += a * ve[j];
          }
          float rowdot = 0;
          for (int64_t j = 0; j < nk; ++j) {
            if (!vis[static_cast<size_t>(i * nk + j)]) {
              ds[j] = 0;
              continue;
            }
            ds[j] = Ri(ds[j]);  // dP
            rowdot += ds[j] * pout[static_cast<size_t>(i * nk + j)];
          }
          for (int64_t j = 0; j < nk; ++j) {
            if (!vis[static_cast<size_t>(i * nk + j)]) continue;
            const float pj = pout[static_cast<size_t>(i * nk + j)];
            float dsj = Ri(pj * (ds[j] - rowdot));
            if (cap > 0) {
              const float tj = th[static_cast<size_t>(i * nk + j)];
              dsj = Ri(Ri(Ri(dsj * cap) * (1.0f - tj * tj)) / cap);
            }
            ds[j] = dsj;
          }
          // dq'_d = sum_j dS_j k_jd (sequential in j), then the scale's backward.
          std::vector<float>& acc_d = ready(worker).acc_d;
          std::fill(acc_d.begin(), acc_d.begin() + D, 0.0f);
          for (int64_t j = 0; j < nk; ++j) {
            if (!vis[static_cast<size_t>(i * nk + j)]) continue;
            const float dsj = ds[j];
            const float* kr = &kh[static_cast<size_t>(j * D)];
            for (int64_t d = 0; d < D; ++d) acc_d[static_cast<size_t>(d)] += dsj * kr[d];
          }
          for (int64_t d = 0; d < D; ++d) {
            const float gq = Ri(acc_d[static_cast<size_t>(d)]);
            dq[static_cast<size_t>((t * H + h) * D + d)] =
                default_scale ? R(gq / sqrt_d) : R(gq * scale_f);
          }
        });
        // dk_jd += dS_j q'_d and dv_je += p_j dO_e, sequential in i (the block's rows in
        // order, blocks in order), keys in parallel.
        chunked(nk, [&](int64_t j0, int64_t j1) {
          for (int64_t i = i0; i < i1; ++i) {
            const float* g = dorow(i);
            const float* qr = &qs[static_cast<size_t>(i * D)];
            const float* ds = dsb.data() + (i - i0) * nk;
            for (int64_t j = j0; j < j1; ++j) {
              if (!vis[static_cast<size_t>(i * nk + j)]) continue;
              const float dsj = ds[j];
              const float pj = pr[static_cast<size_t>(i * nk + j)];
              float* dkr = &dk_acc[static_cast<size_t>(j * D)];
              float* dvr = &dv_acc[static_cast<size_t>(j * Dv)];
              for (int64_t d = 0; d < D; ++d) dkr[d] += dsj * qr[d];
              for (int64_t e = 0; e < Dv; ++e) dvr[e] += pj * g[e];
            }
          }
        });
      }
      // Per-head gradients are tensors of the dtype; repeat's backward sums them in fp32.
      const bool first_of_group = h % p.gqa_ratio() == 0;
      const bool last_of_group = h % p.gqa_ratio() == p.gqa_ratio() - 1;
      chunked(nk, [&](int64_t j0, int64_t j1) {
        const auto kd0 = static_cast<size_t>(j0 * D), kd1 = static_cast<size_t>(j1 * D);
        const auto vd0 = static_cast<size_t>(j0 * Dv), vd1 = static_cast<size_t>(j1 * Dv);
        if (first_of_group) {
          std::fill(dk_group.begin() + kd0, dk_group.begin() + kd1, 0.0f);
          std::fill(dv_group.begin() + vd0, dv_group.begin() + vd1, 0.0f);
        }
        for (size_t x = kd0; x < kd1; ++x) dk_group[x] += Ri(dk_acc[x]);
        for (size_t x = vd0; x < vd1; ++x) dv_group[x] += Ri(dv_acc[x]);
        if (!last_of_group) return;
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t tk = seq.k_begin + j;
          for (int64_t d = 0; d < D; ++d) {
            dk[static_cast<size_t>((tk * Hk + hk) * D + d)] =
                R(dk_group[static_cast<size_t>(j * D + d)]);
          }
          for (int64_t e = 0; e < Dv; ++e) {
            dv[static_cast<size_t>((tk * Hk + hk) * Dv + e)] =
                R(dv_group[static_cast<size_t>(j * Dv + e)]);
          }
        }
      });
    }
  }

  BaselineOut out;
  out.o = FromFloats(p.OShape(), o);
  out.lse = FromFloats(p.LseShape(), lse);
  if (backward) {
    out.dq = FromFloats(p.QShape(), dq);
    out.dk = FromFloats(p.KShape(), dk);
    out.dv = FromFloats(p.VShape(), dv);
  }
  return out;
}

}  // namespace

Expected<BaselineOut> BaselineForward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v, BaselineMode mode, int threads) {
  return Run(p, q, k, v, nullptr, mode, nullptr, threads);
}

Expected<BaselineOut> BaselineBackward(const Problem& p, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& dout, BaselineMode mode,
                                       int threads) {
  return Run(p, q, k, v, &dout, mode, nullptr, threads);
}

// ---- The recipe reference (see baseline.h) ----

Expected<Tensor> QuantizeForRecipe(const Tensor& t, const OperandQuant& quant) {
  if (quant.scheme.kind == OperandKind::kNone) return t;
  const Tensor c = ToF64(t);
  const auto span = c.span<const double>();
  std::vector<float> f(span.begin(), span.end());
  const int64_t axis =
      quant.axis == QuantAxis::kSequence ? (c.rank() == 4 ? 1 : 0) : c.rank() - 1;
  Expected<std::vector<float>> r = QuantizeOperand(f, c.shape(), axis, quant.scheme);
  if (!r.ok()) return r.error();
  return Tensor::FromF64(c.shape(), std::vector<double>(r->begin(), r->end()));
}

namespace {

// Rounds a row-major [rows, cols] matrix of one (batch, head) by `quant` (element schemes
// elementwise, block schemes along cols for kSequence-of-keys operands (axis 1) or rows).
Status RoundMatrix(std::vector<double>& m, int64_t rows, int64_t cols, const OperandQuant& quant,
                   int64_t axis) {
  if (quant.scheme.kind == OperandKind::kNone) return Status::Ok();
  if (quant.scheme.kind == OperandKind::kElement) {
    for (double& x : m) x = RoundElement(static_cast<float>(x), quant.scheme);
    return Status::Ok();
  }
  std::vector<float> f(m.begin(), m.end());
  Expected<std::vector<float>> r = QuantizeOperand(f, Shape{rows, cols}, axis, quant.scheme);
  if (!r.ok()) return r.error();
  for (size_t x = 0; x < m.size(); ++x) m[x] = (*r)[x];
  return Status::Ok();
}

double RoundOut(double x, Format f) { return f == Format::kF64 ? x : RoundTo(x, f); }
// An output rounding at a power-of-two pre-scale (recipe.h OutputRounding): exact scaling,
// saturating at the format's largest finite value.
double RoundOut(double x, const OperandScheme& s) {
  if (s.pre_scale == 1.0 && s.overflow == Overflow::kDefault) return RoundOut(x, s.element);
  EncodeOptions options;
  options.overflow = s.overflow;
  return RoundTo(x * s.pre_scale, s.element, options) / s.pre_scale;
}

Expected<BaselineOut> RunRecipe(const Problem& p, const Recipe& r, const Tensor& q_in,
                                const Tensor& k_in, const Tensor& v_in, const Tensor* dout_in) {
  if (Status s = Validate(p); !s.ok()) return s.error();
  if (Status s = ValidateInputShapes(p, q_in, k_in, v_in, dout_in); !s.ok()) return s.error();
  if (Status s = ValidateRecipe(r); !s.ok()) return s.error();
  const bool backward = dout_in != nullptr;
  const auto quantized = [&](const Tensor& t, const OperandQuant& qu,
                             const char* what) -> Expected<Tensor> {
    Expected<Tensor> x = QuantizeForRecipe(t, qu);
    if (!x.ok()) {
      return Error{fmt::format("recipe reference {}: operand {}: {}", r.name, what,
                               x.error().message)};
    }
    return x;
  };
  // Forward operands, then the backward's own copies.
  auto q_s = quantized(q_in, r.qk.a, "Q of Q.K^T");
  auto k_s = quantized(k_in, r.qk.b, "K of Q.K^T");
  auto v_o = quantized(v_in, r.pv.b, "V of P.V");
  if (!q_s.ok()) return q_s.error();
  if (!k_s.ok()) return k_s.error();
  if (!v_o.ok()) return v_o.error();
  Tensor do_p, v_p, do_v, k_q, q_k, do_raw;
  if (backward) {
    auto a = quantized(*dout_in, r.dov.a, "dO of dO.V^T");
    auto b = quantized(v_in, r.dov.b, "V of dO.V^T");
    auto c = quantized(*dout_in, r.pdo.b, "dO of P^T.dO");
    auto d = quantized(k_in, r.dsk.b, "K of dS.K");
    auto e = quantized(q_in, r.dsq.b, "Q of dS^T.Q");
    for (auto* x : {&a, &b, &c, &d, &e}) {
      if (!x->ok()) return x->error();
    }
    do_p = std::move(*a);
    v_p = std::move(*b);
    do_v = std::move(*c);
    k_q = std::move(*d);
    q_k = std::move(*e);
    do_raw = ToF64(*dout_in);
  }
  const Format in_f = FormatOf(p.dtype).value_or(Format::kF32);
  const OperandScheme out_f = OutputRoundingOf(r, in_f);
  const OperandScheme grad_f[3] = {GradientRoundingOf(r, in_f, 0), GradientRoundingOf(r, in_f, 1),
                                   GradientRoundingOf(r, in_f, 2)};
  const int64_t H = p.heads_q, Hk = p.heads_kv, D = p.head_dim, Dv = p.head_dim_v;
  const double scale = p.EffectiveScale();
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  const double* qs = q_s->data<double>();
  const double* ks = k_s->data<double>();
  const double* vo = v_o->data<double>();
  std::vector<double> o(static_cast<size_t>(p.TotalQ() * H * Dv), 0.0);
  std::vector<double> lse(static_cast<size_t>(p.TotalQ() * H), kNegInf);
  std::vector<double> dq, dk, dv;
  if (backward) {
    dq.assign(static_cast<size_t>(p.TotalQ() * H * D), 0.0);
    dk.assign(static_cast<size_t>(p.TotalK() * Hk * D), 0.0);
    dv.assign(static_cast<size_t>(p.TotalK() * Hk * Dv), 0.0);
  }
  const auto QI = [&](int64_t t, int64_t h) { return (t * H + h) * D; };
  const auto KI = [&](int64_t t, int64_t h) { return (t * Hk + h) * D; };
  const auto VI = [&](int64_t t, int64_t h) { return (t * Hk + h) * Dv; };
  const auto OI = [&](int64_t t, int64_t h) { return (t * H + h) * Dv; };
  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence seq = mask.sequence();
    const int64_t nq = seq.q_len, nk = seq.k_len;
    if (nq == 0) continue;
    const auto LI = [&](int64_t h, int64_t i) {
      return p.varlen() ? h * p.TotalQ() + seq.q_begin + i : (b * H + h) * p.seqlen_q + i;
    };
    std::vector<double> s(static_cast<size_t>(nq * nk)), c(static_cast<size_t>(nq * nk), 1.0);
    std::vector<uint8_t> vis;
    TileVisibility(mask, 0, nq, 0, nk, vis);  // the same for every head
    std::vector<double> pmat, ds_k, ds_q, o_raw(static_cast<size_t>(nq * Dv));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = p.KvHead(h);
      const double slope = p.alibi_slopes ? (*p.alibi_slopes)[static_cast<size_t>(h)] : 0.0;
      // Scores from the quantised Q·Kᵀ operands.
      for (int64_t i = 0; i < nq; ++i) {
        const double* qr = qs + QI(seq.q_begin + i, h);
        for (int64_t j = 0; j < nk; ++j) {
          const size_t ij = static_cast<size_t>(i * nk + j);
          if (!vis[ij]) continue;
          const double* kr = ks + KI(seq.k_begin + j, hk);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
          const double raw = scale * dot;
          s[ij] = TransformScore(raw, p.softcap, slope, mask.AlibiDistance(i, j));
          if (p.softcap > 0) {
            const double t = std::tanh(raw / p.softcap);
            c[ij] = 1 - t * t;
          }
        }
      }
      // Forward: P = exp(s - m) rounded by pv.a, o = Σ round(P) v / Σ P.
      pmat.assign(static_cast<size_t>(nq * nk), 0.0);
      std::vector<double> rowsum(static_cast<size_t>(nq), 0.0);
      for (int64_t i = 0; i < nq; ++i) {
        double m = kNegInf;
        for (int64_t j = 0; j < nk; ++j) {
          if (vis[static_cast<size_t>(i * nk + j)]) m = std::max(m, s[static_cast<size_t>(i * nk + j)]);
        }
        if (m == kNegInf) continue;
        double l = 0;
        for (int64_t j = 0; j < nk; ++j) {
          const size_t ij = static_cast<size_t>(i * nk + j);
          if (!vis[ij]) continue;
          pmat[ij] = std::exp(s[ij] - m);
          l += pmat[ij];
        }
        rowsum[static_cast<size_t>(i)] = l;
        lse[static_cast<size_t>(LI(h, i))] = RoundOut(m + std::log(l), r.lse);
      }
      if (Status st = RoundMatrix(pmat, nq, nk, r.pv.a, 1); !st.ok()) return st.error();
      for (int64_t i = 0; i < nq; ++i) {
        const double l = rowsum[static_cast<size_t>(i)];
        double* orow = o_raw.data() + i * Dv;
        std::fill(orow, orow + Dv, 0.0);
        if (l == 0) continue;
        for (int64_t j = 0; j < nk; ++j) {
          const double pj = pmat[static_cast<size_t>(i * nk + j)];
          if (pj == 0) continue;
          const double* vr = vo + VI(seq.k_begin + j, hk);
          for (int64_t e = 0; e < Dv; ++e) orow[e] += pj * vr[e];
        }
        for (int64_t e = 0; e < Dv; ++e) {
          orow[e] /= l;
          o[static_cast<size_t>(OI(seq.q_begin + i, h) + e)] = RoundOut(orow[e], out_f);
        }
      }
      if (!backward) continue;
      // Backward: normalised P from the exact lse of these scores.
      const double* dop = do_p.data<double>();
      const double* dov = do_v.data<double>();
      // D's dO: as given, or as dO·Vᵀ reads it (recipe.h DeltaDo).
      const double* dor =
          r.delta_do == DeltaDo::kDovOperand ? do_p.data<double>() : do_raw.data<double>();
      const double* vp = v_p.data<double>();
      const double* kq = k_q.data<double>();
      const double* qk = q_k.data<double>();
      pmat.assign(static_cast<size_t>(nq * nk), 0.0);
      ds_k.assign(static_cast<size_t>(nq * nk), 0.0);
      for (int64_t i = 0; i < nq; ++i) {
        const double l = rowsum[static_cast<size_t>(i)];
        if (l == 0) continue;
        double m = kNegInf;
        for (int64_t j = 0; j < nk; ++j) {
          if (vis[static_cast<size_t>(i * nk + j)]) m = std::max(m, s[static_cast<size_t>(i * nk + j)]);
        }
        const double lse_i = m + std::log(l);
        const int64_t t = seq.q_begin + i;
        // D = rowsum(dO∘O) with the O and the dO the recipe names.
        double delta = 0;
        for (int64_t e = 0; e < Dv; ++e) {
          const double oe = r.delta == DeltaSource::kRoundedO
                                ? o[static_cast<size_t>(OI(t, h) + e)]
                                : o_raw[static_cast<size_t>(i * Dv + e)];
          delta += dor[OI(t, h) + e] * oe;
        }
        for (int64_t j = 0; j < nk; ++j) {
          const size_t ij = static_cast<size_t>(i * nk + j);
          if (!vis[ij]) continue;
          const double pj = std::exp(s[ij] - lse_i);
          const double* vr = vp + VI(seq.k_begin + j, hk);
          double dp = 0;
          for (int64_t e = 0; e < Dv; ++e) dp += dop[OI(t, h) + e] * vr[e];
          if (r.dp) dp = RoundTo(dp, *r.dp);
          pmat[ij] = pj;
          ds_k[ij] = pj * (dp - delta) * c[ij];
        }
      }
      ds_q = ds_k;
      if (Status st = RoundMatrix(pmat, nq, nk, r.pdo.a, 0); !st.ok()) return st.error();
      if (Status st = RoundMatrix(ds_k, nq, nk, r.dsk.a, 1); !st.ok()) return st.error();
      if (Status st = RoundMatrix(ds_q, nq, nk, r.dsq.a, 0); !st.ok()) return st.error();
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = seq.q_begin + i;
        double* dqr = dq.data() + QI(t, h);
        for (int64_t j = 0; j < nk; ++j) {
          const size_t ij = static_cast<size_t>(i * nk + j);
          if (!vis[ij]) continue;
          const int64_t tk = seq.k_begin + j;
          const double* kr = kq + KI(tk, hk);
          const double* qr = qk + QI(t, h);
          const double* gr = dov + OI(t, h);
          double* dkr = dk.data() + KI(tk, hk);
          double* dvr = dv.data() + VI(tk, hk);
          const double a = ds_k[ij] * scale, bq = ds_q[ij] * scale, pj = pmat[ij];
          for (int64_t d = 0; d < D; ++d) dqr[d] += a * kr[d];
          for (int64_t d = 0; d < D; ++d) dkr[d] += bq * qr[d];
          for (int64_t e = 0; e < Dv; ++e) dvr[e] += pj * gr[e];
        }
      }
    }
  }
  BaselineOut out;
  out.o = Tensor::FromF64(p.OShape(), std::move(o));
  out.lse = Tensor::FromF64(p.LseShape(), std::move(lse));
  if (backward) {
    for (double& x : dq) x = RoundOut(x, grad_f[0]);
    for (double& x : dk) x = RoundOut(x, grad_f[1]);
    for (double& x : dv) x = RoundOut(x, grad_f[2]);
    out.dq = Tensor::FromF64(p.QShape(), std::move(dq));
    out.dk = Tensor::FromF64(p.KShape(), std::move(dk));
    out.dv = Tensor::FromF64(p.VShape(), std::move(dv));
  }
  return out;
}

}  // namespace

Expected<BaselineOut> RecipeReferenceForward(const Problem& p, const Recipe& recipe,
                                             const Tensor& q, const Tensor& k, const Tensor& v) {
  return RunRecipe(p, recipe, q, k, v, nullptr);
}

Expected<BaselineOut> RecipeReferenceBackward(const Problem& p, const Recipe& recipe,
                                              const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& dout) {
  return RunRecipe(p, recipe, q, k, v, &dout);
}

Expected<BaselineOut> ProfileBaseline(const Profile& profile, const Problem& p, const Tensor& q,
                                      const Tensor& k, const Tensor& v, const Tensor* dout,
                                      const std::vector<uint8_t>* query_rows, int threads) {
  if (query_rows != nullptr) {
    if (!profile.baseline_recipe.empty() || dout != nullptr) {
      // (JudgeAgainstOracle names the profile.)
      return Error{"sampled rows have a baseline only for the forward of the same-precision "
                   "path (verify/tolerance/baseline.h); this profile's baseline needs every row"};
    }
    return Run(p, q, k, v, nullptr, BaselineMode::kSdpaMath, query_rows, threads);
  }
  if (profile.baseline_recipe.empty()) {
    return dout != nullptr
               ? BaselineBackward(p, q, k, v, *dout, BaselineMode::kSdpaMath, threads)
               : BaselineForward(p, q, k, v, BaselineMode::kSdpaMath, threads);
  }
  const Recipe* r = FindRecipe(profile.baseline_recipe);
  if (r == nullptr) {
    return Error{fmt::format("profile {}: baseline_recipe '{}' is not a recipe", profile.name,
                             profile.baseline_recipe)};
  }
  return dout != nullptr ? RecipeReferenceBackward(p, *r, q, k, v, *dout)
                         : RecipeReferenceForward(p, *r, q, k, v);
}

}  // namespace attest
