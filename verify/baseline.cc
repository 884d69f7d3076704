// The same-precision "pt" reference (see baseline.h for the rounding points and sources).
#include "verify/baseline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/formats/format.h"
#include "reference/problem/mask.h"

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

Expected<BaselineOut> Run(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor* dout, BaselineMode mode) {
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

  for (int64_t b = 0; b < p.batch; ++b) {
    const MaskView mask(p, b);
    const Sequence seq = mask.sequence();
    const int64_t nq = seq.q_len, nk = seq.k_len;
    // Per-head buffers, reused: scaled q', softmax output (rounded, and fp32 for ALiBi),
    // tanh values for the softcap backward, visibility.
    std::vector<float> qs(static_cast<size_t>(nq * D));
    std::vector<float> pr(static_cast<size_t>(nq * nk)), p32, th;
    std::vector<char> vis(static_cast<size_t>(nq * nk));
    std::vector<float> dk_acc(static_cast<size_t>(nk * D)), dv_acc(static_cast<size_t>(nk * Dv));
    std::vector<float> dk_group(static_cast<size_t>(nk * D)),
        dv_group(static_cast<size_t>(nk * Dv));
    if (alibi) p32.assign(static_cast<size_t>(nq * nk), 0.0f);
    if (cap > 0) th.assign(static_cast<size_t>(nq * nk), 0.0f);
    // Per-head copies of k and v in both orientations, so that every sum below runs over
    // contiguous memory with independent accumulators per output element (vectorisable while
    // each element's own sum stays sequential in its index, the order documented above).
    std::vector<float> kh(static_cast<size_t>(nk * D)), kt(static_cast<size_t>(D * nk));
    std::vector<float> vh(static_cast<size_t>(nk * Dv)), vt(static_cast<size_t>(Dv * nk));
    std::vector<float> qs32(static_cast<size_t>(nq * D));
    std::vector<float> s(static_cast<size_t>(nk)), s32(static_cast<size_t>(nk));
    std::vector<float> acc_d(static_cast<size_t>(std::max(D, Dv)));
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
        for (int64_t j = 0; j < nk; ++j) {
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
      // ---- forward ----
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = seq.q_begin + i;
        // Raw scores of row i against every key: s_j = sum_d q'_d k_jd, sequential in d.
        std::fill(s.begin(), s.end(), 0.0f);
        for (int64_t d = 0; d < D; ++d) {
          const float a = qs[static_cast<size_t>(i * D + d)];
          const float* kd = kt.data() + d * nk;
          for (int64_t j = 0; j < nk; ++j) s[static_cast<size_t>(j)] += a * kd[j];
        }
        if (every_op) {
          std::fill(s32.begin(), s32.end(), 0.0f);
          for (int64_t d = 0; d < D; ++d) {
            const float a = qs32[static_cast<size_t>(i * D + d)];
            const float* kd = kt.data() + d * nk;
            for (int64_t j = 0; j < nk; ++j) s32[static_cast<size_t>(j)] += a * kd[j];
          }
        } else {
          s32 = s;  // the SDPA math path's scores are the fp32 ones
        }
        float m = kNegInf, m32 = kNegInf;
        for (int64_t j = 0; j < nk; ++j) {
          const bool visible = mask.Visible(i, j);
          vis[static_cast<size_t>(i * nk + j)] = visible;
          if (!visible) continue;
          float sj = Ri(s[static_cast<size_t>(j)]);
          float sj32 = s32[static_cast<size_t>(j)];
          if (cap > 0) {
            const float tj = Ri(std::tanh(Ri(sj / cap)));
            th[static_cast<size_t>(i * nk + j)] = tj;
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
        if (m == kNegInf) continue;  // empty row: p = 0, o = 0, lse = -inf
        float sum = 0, sum32 = 0;
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[static_cast<size_t>(i * nk + j)]) continue;
          const float e = std::exp(s[static_cast<size_t>(j)] - m);
          s[static_cast<size_t>(j)] = e;
          sum += e;
          sum32 += std::exp(s32[static_cast<size_t>(j)] - m32);
        }
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[static_cast<size_t>(i * nk + j)]) continue;
          const float pj = s[static_cast<size_t>(j)] / sum;
          if (alibi) p32[static_cast<size_t>(i * nk + j)] = pj;
          pr[static_cast<size_t>(i * nk + j)] = Ri(pj);
        }
        lse_at(b, h, t, i) = m32 + std::log(sum32);
        // o_e = sum_j p_j v_je, sequential in j (masked keys add exact zeros: skipped).
        std::fill(acc_d.begin(), acc_d.begin() + Dv, 0.0f);
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[static_cast<size_t>(i * nk + j)]) continue;
          const float pj = pr[static_cast<size_t>(i * nk + j)];
          const float* vr = &vh[static_cast<size_t>(j * Dv)];
          for (int64_t e = 0; e < Dv; ++e) acc_d[static_cast<size_t>(e)] += pj * vr[e];
        }
        for (int64_t e = 0; e < Dv; ++e) {
          o[static_cast<size_t>((t * H + h) * Dv + e)] = R(acc_d[static_cast<size_t>(e)]);
        }
      }
      if (!backward) continue;
      // ---- backward ----
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      std::vector<float> ds(static_cast<size_t>(nk));
      const std::vector<float>& pout = alibi ? p32 : pr;
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = seq.q_begin + i;
        const float* g = dorow(i);
        // dP_j = sum_e dO_e v_je (sequential in e), then the softmax backward from its
        // (rounded, or fp32 with ALiBi) output.
        std::fill(ds.begin(), ds.end(), 0.0f);
        for (int64_t e = 0; e < Dv; ++e) {
          const float a = g[e];
          const float* ve = vt.data() + e * nk;
          for (int64_t j = 0; j < nk; ++j) ds[static_cast<size_t>(j)] += a * ve[j];
        }
        float rowdot = 0;
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[static_cast<size_t>(i * nk + j)]) {
            ds[static_cast<size_t>(j)] = 0;
            continue;
          }
          ds[static_cast<size_t>(j)] = Ri(ds[static_cast<size_t>(j)]);  // dP
          rowdot += ds[static_cast<size_t>(j)] * pout[static_cast<size_t>(i * nk + j)];
        }
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[static_cast<size_t>(i * nk + j)]) continue;
          const float pj = pout[static_cast<size_t>(i * nk + j)];
          float dsj = Ri(pj * (ds[static_cast<size_t>(j)] - rowdot));
          if (cap > 0) {
            const float tj = th[static_cast<size_t>(i * nk + j)];
            dsj = Ri(Ri(Ri(dsj * cap) * (1.0f - tj * tj)) / cap);
          }
          ds[static_cast<size_t>(j)] = dsj;
        }
        // dq'_d = sum_j dS_j k_jd (sequential in j), then the scale's backward.
        std::fill(acc_d.begin(), acc_d.begin() + D, 0.0f);
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[static_cast<size_t>(i * nk + j)]) continue;
          const float dsj = ds[static_cast<size_t>(j)];
          const float* kr = &kh[static_cast<size_t>(j * D)];
          for (int64_t d = 0; d < D; ++d) acc_d[static_cast<size_t>(d)] += dsj * kr[d];
        }
        for (int64_t d = 0; d < D; ++d) {
          const float gq = Ri(acc_d[static_cast<size_t>(d)]);
          dq[static_cast<size_t>((t * H + h) * D + d)] =
              default_scale ? R(gq / sqrt_d) : R(gq * scale_f);
        }
        // dk_jd += dS_j q'_d and dv_je += p_j dO_e, sequential in i.
        for (int64_t j = 0; j < nk; ++j) {
          if (!vis[static_cast<size_t>(i * nk + j)]) continue;
          const float dsj = ds[static_cast<size_t>(j)];
          const float pj = pr[static_cast<size_t>(i * nk + j)];
          float* dkr = &dk_acc[static_cast<size_t>(j * D)];
          float* dvr = &dv_acc[static_cast<size_t>(j * Dv)];
          const float* qr = &qs[static_cast<size_t>(i * D)];
          for (int64_t d = 0; d < D; ++d) dkr[d] += dsj * qr[d];
          for (int64_t e = 0; e < Dv; ++e) dvr[e] += pj * g[e];
        }
      }
      // Per-head gradients are tensors of the dtype; repeat's backward sums them in fp32.
      const bool first_of_group = h % p.gqa_ratio() == 0;
      if (first_of_group) {
        std::fill(dk_group.begin(), dk_group.end(), 0.0f);
        std::fill(dv_group.begin(), dv_group.end(), 0.0f);
      }
      for (size_t x = 0; x < dk_acc.size(); ++x) dk_group[x] += Ri(dk_acc[x]);
      for (size_t x = 0; x < dv_acc.size(); ++x) dv_group[x] += Ri(dv_acc[x]);
      if (h % p.gqa_ratio() == p.gqa_ratio() - 1) {
        for (int64_t j = 0; j < nk; ++j) {
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
      }
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
                                      const Tensor& v, BaselineMode mode) {
  return Run(p, q, k, v, nullptr, mode);
}

Expected<BaselineOut> BaselineBackward(const Problem& p, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& dout, BaselineMode mode) {
  return Run(p, q, k, v, &dout, mode);
}

}  // namespace attest
