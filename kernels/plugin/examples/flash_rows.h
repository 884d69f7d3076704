/* flash_rows.h — the arithmetic of the example CUDA attention plugin, one query row or one
 * key row per call, written once for the GPU (nvcc, __host__ __device__) and for the host
 * (g++), so that the CPU build of exactly this code runs attest's gate in CI
 * (examples/host_flash.cc) and the CUDA build (examples/cuda_flash.cu) runs it on a GPU.
 *
 * Semantics: docs/design.md "Semantics" and reference/problem/mask.h (bottom-right or top-left
 * causal diagonal, windows relative to it, score = softcap(scale q.k) - alibi distance,
 * empty rows o = 0 and lse = -inf). Arithmetic: inputs widened to fp32, fp32 fused
 * multiply-adds, online softmax (Milakov & Gimelshein 2018, FlashAttention-2 Alg. 1) for the
 * forward, and for the backward D = rowsum(dO o O), P recomputed from lse,
 * dS = P o (dP - D) (FlashAttention-2 Alg. 2). dq is accumulated per query row; dk and dv
 * per (query head, key row), then folded over the GQA group per key row; each sum by one
 * thread in a fixed order: no atomics, bitwise deterministic.
 * Outputs are rounded once to the input dtype (round to nearest even).
 */
#ifndef ATTEST_EXAMPLES_FLASH_ROWS_H_
#define ATTEST_EXAMPLES_FLASH_ROWS_H_

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define ATTEST_HD __host__ __device__ inline
#else
#include <string.h>
#define ATTEST_HD inline
#endif

namespace attest_example {

/* Local accumulators are arrays of this many floats (head dims up to 256). */
constexpr int kMaxHeadDim = 256;
/* Largest GQA group (heads_q / heads_kv) the dk/dv reduction takes. */
constexpr int kMaxGroup = 128;

/* Element types: the attest_dtype values of attest_kernel.h. */
constexpr int32_t kElemF32 = 1;
constexpr int32_t kElemBF16 = 2;
constexpr int32_t kElemF16 = 3;

/* Seeded bugs for the mutant plugin (0 in the correct plugin). */
constexpr int32_t kFaultNone = 0;
constexpr int32_t kFaultCausalOffByOne = 1; /* the causal bound lets key diag + 1 through */
constexpr int32_t kFaultNoRescale = 2;      /* the running sum is not rescaled on a new max */

ATTEST_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

ATTEST_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

ATTEST_HD float NegInf() { return BitsFloat(0xff800000u); }

ATTEST_HD float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

/* Round to nearest even; NaN stays a (quiet) NaN with its sign. */
ATTEST_HD uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

ATTEST_HD float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    /* Zero or subnormal: m * 2^-24, exact in fp32. */
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  if (e == 31) return BitsFloat(sign | 0x7f800000u | (m << 13));
  return BitsFloat(sign | ((e + 112u) << 23) | (m << 13));
}

/* Round to nearest even, overflow to infinity (IEEE 754 binary16). */
ATTEST_HD uint16_t FloatToF16(float f) {
  const uint32_t bits = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t x = bits & 0x7fffffffu;
  /* 1. Non-finite. */
  if (x >= 0x7f800000u) return sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u);
  /* 2. 65520 = 65504 + half an ulp and above round (ties to even) to infinity. */
  if (x >= 0x477ff000u) return sign | 0x7c00u;
  /* 3. Below half the smallest subnormal (2^-25): zero. */
  if (x < 0x33000000u) return sign;
  const uint32_t e = x >> 23;
  const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  if (e < 113) {
    /* 4. Subnormal result: units of 2^-24; mant * 2^(e - 150) = (mant >> (126 - e)) ulps. */
    const uint32_t shift = 126u - e; /* 14 .. 24 */
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r; /* may carry into the smallest normal */
    return sign | static_cast<uint16_t>(r);
  }
  /* 5. Normal: rebias (127 -> 15), keep 10 fraction bits, carry may reach infinity's code
   * only for x >= 65520, excluded above. */
  uint32_t r = ((e - 112u) << 10) | ((x >> 13) & 0x3ffu);
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

/* A strided tensor as the kernel sees it (strides in elements). */
struct TensorRef {
  void* data;
  int32_t dtype;
  int64_t stride[4];
};

ATTEST_HD float LoadAt(const TensorRef& t, int64_t offset) {
  switch (t.dtype) {
    case kElemBF16: return Bf16ToFloat(static_cast<const uint16_t*>(t.data)[offset]);
    case kElemF16: return F16ToFloat(static_cast<const uint16_t*>(t.data)[offset]);
    default: return static_cast<const float*>(t.data)[offset];
  }
}

ATTEST_HD void StoreAt(const TensorRef& t, int64_t offset, float x) {
  switch (t.dtype) {
    case kElemBF16: static_cast<uint16_t*>(t.data)[offset] = FloatToBf16(x); break;
    case kElemF16: static_cast<uint16_t*>(t.data)[offset] = FloatToF16(x); break;
    default: static_cast<float*>(t.data)[offset] = x; break;
  }
}

/* Everything a row needs; plain data, passed to a CUDA kernel by value. Pointers are device
 * pointers on the GPU and host pointers in the host build. */
struct Params {
  TensorRef q, k, v, o, lse, dout, dq, dk, dv;
  float* delta;               /* [Hq, total_q] scratch: D per query row */
  float* dk_part;             /* [Hq, total_k, D] scratch: each query head's share of dk */
  float* dv_part;             /* [Hq, total_k, Dv] scratch: each query head's share of dv */
  const float* alibi_slopes;  /* [Hq] or null */
  const int32_t* cu_seqlens_q; /* [B + 1] or null (then tensors are [B, S, H, D]) */
  const int32_t* cu_seqlens_k;
  int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v;
  int64_t window_left, window_right; /* -1: unbounded */
  int32_t causal, top_left, fault;
  float scale, softcap;
};

/* One sequence of the batch: first token and length on each side. */
struct Seq {
  int64_t q_begin, q_len, k_begin, k_len;
};

ATTEST_HD Seq SeqOf(const Params& p, int64_t b) {
  Seq s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_begin = p.cu_seqlens_q[b];
    s.q_len = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    s.k_begin = p.cu_seqlens_k[b];
    s.k_len = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  } else {
    s.q_begin = b * p.seqlen_q;
    s.q_len = p.seqlen_q;
    s.k_begin = b * p.seqlen_k;
    s.k_len = p.seqlen_k;
  }
  return s;
}

/* Element offset of token `t` (flattened: b * S + i, or the packed index), head h, dim d. */
ATTEST_HD int64_t TokenOffset(const Params& p, const TensorRef& x, int64_t t, int64_t seqlen,
                              int64_t h, int64_t d) {
  if (p.cu_seqlens_q != nullptr) return t * x.stride[0] + h * x.stride[1] + d * x.stride[2];
  const int64_t b = t / seqlen, i = t % seqlen;
  return b * x.stride[0] + i * x.stride[1] + h * x.stride[2] + d * x.stride[3];
}

/* The stride of the head-dim axis (the last one). */
ATTEST_HD int64_t DimStride(const Params& p, const TensorRef& x) {
  return p.cu_seqlens_q != nullptr ? x.stride[2] : x.stride[3];
}

/* lse [B, Hq, Sq] or packed [Hq, total_q]. */
ATTEST_HD int64_t LseOffset(const Params& p, int64_t t, int64_t h) {
  if (p.cu_seqlens_q != nullptr) return h * p.lse.stride[0] + t * p.lse.stride[1];
  const int64_t b = t / p.seqlen_q, i = t % p.seqlen_q;
  return b * p.lse.stride[0] + h * p.lse.stride[1] + i * p.lse.stride[2];
}

ATTEST_HD int64_t DeltaIndex(const Params& p, int64_t t, int64_t h) {
  const int64_t total_q = p.cu_seqlens_q != nullptr ? p.cu_seqlens_q[p.batch] : p.batch * p.seqlen_q;
  return h * total_q + t;
}

ATTEST_HD int64_t TotalK(const Params& p) {
  return p.cu_seqlens_k != nullptr ? p.cu_seqlens_k[p.batch] : p.batch * p.seqlen_k;
}

/* The right bound of the band relative to the diagonal (causal caps it at 0), -1 unbounded. */
ATTEST_HD int64_t RightBound(const Params& p) {
  if (!p.causal) return p.window_right;
  /* Causal is the window (L, 0): the right bound is the diagonal whatever window_right says
   * (reference/problem/mask.cc caps it at min(R, 0) with -1 meaning unbounded). */
  return p.fault == kFaultCausalOffByOne ? 1 : 0;
}

ATTEST_HD int64_t DiagOffset(const Params& p, const Seq& s) {
  return p.top_left ? 0 : s.k_len - s.q_len;
}

/* Keys [lo, hi) visible to query i of sequence s (the mask is exactly this band). */
ATTEST_HD void KeyRange(const Params& p, const Seq& s, int64_t i, int64_t* lo, int64_t* hi) {
  const int64_t diag = i + DiagOffset(p, s);
  const int64_t right = RightBound(p);
  int64_t a = p.window_left >= 0 ? diag - p.window_left : 0;
  int64_t z = right >= 0 ? diag + right + 1 : s.k_len;
  if (a < 0) a = 0;
  if (z > s.k_len) z = s.k_len;
  if (z < a) z = a;
  *lo = a;
  *hi = z;
}

/* Queries [lo, hi) that see key j: j >= diag - L <=> i <= j - off + L; j <= diag + R <=>
 * i >= j - off - R. */
ATTEST_HD void QueryRange(const Params& p, const Seq& s, int64_t j, int64_t* lo, int64_t* hi) {
  const int64_t off = DiagOffset(p, s);
  const int64_t right = RightBound(p);
  int64_t a = right >= 0 ? j - off - right : 0;
  int64_t z = p.window_left >= 0 ? j - off + p.window_left + 1 : s.q_len;
  if (a < 0) a = 0;
  if (z > s.q_len) z = s.q_len;
  if (z < a) z = a;
  *lo = a;
  *hi = z;
}

/* Score of (i, j) from the raw dot product; *tanh_out receives tanh(scale dot / cap) (for the
 * softcap derivative), 0 without softcap. */
ATTEST_HD float Score(const Params& p, const Seq& s, int64_t h, int64_t i, int64_t j, float dot,
                      float* tanh_out) {
  float x = p.scale * dot;
  float t = 0.0f;
  if (p.softcap > 0.0f) {
    t = tanhf(x / p.softcap);
    x = p.softcap * t;
  }
  if (p.alibi_slopes != nullptr) {
    int64_t dist = i + DiagOffset(p, s) - j;
    if (dist < 0) dist = -dist;
    x -= p.alibi_slopes[h] * static_cast<float>(dist);
  }
  *tanh_out = t;
  return x;
}

/* Forward for query row i of sequence b, head h: o and lse. */
ATTEST_HD void ForwardRow(const Params& p, int64_t b, int64_t h, int64_t i) {
  const Seq s = SeqOf(p, b);
  if (i >= s.q_len) return;
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int64_t tq = s.q_begin + i;
  const int64_t qb = TokenOffset(p, p.q, tq, p.seqlen_q, h, 0), qs = DimStride(p, p.q);
  const int64_t ob = TokenOffset(p, p.o, tq, p.seqlen_q, h, 0), os = DimStride(p, p.o);
  float qf[kMaxHeadDim];
  float acc[kMaxHeadDim];
  for (int64_t d = 0; d < p.head_dim; ++d) qf[d] = LoadAt(p.q, qb + d * qs);
  for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] = 0.0f;
  float m = NegInf();
  float l = 0.0f;
  int64_t lo, hi;
  KeyRange(p, s, i, &lo, &hi);
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t tk = s.k_begin + j;
    const int64_t kb = TokenOffset(p, p.k, tk, p.seqlen_k, hk, 0), ks = DimStride(p, p.k);
    const int64_t vb = TokenOffset(p, p.v, tk, p.seqlen_k, hk, 0), vs = DimStride(p, p.v);
    float dot = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) {
      dot = fmaf(qf[d], LoadAt(p.k, kb + d * ks), dot);
    }
    float t;
    const float x = Score(p, s, h, i, j, dot, &t);
    if (x > m) {
      /* New running maximum: rescale what was summed so far (exp(-inf) = 0 on the first). */
      const float corr = expf(m - x);
      if (p.fault != kFaultNoRescale) l *= corr;
      for (int64_t d = 0; d < p.head_dim_v; ++d) acc[d] *= corr;
      m = x;
    }
    const float e = expf(x - m);
    l += e;
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      acc[d] = fmaf(e, LoadAt(p.v, vb + d * vs), acc[d]);
    }
  }
  /* Empty means no visible key (then l = 0); a NaN score must come out as NaN, not as an
   * empty row. With a visible key the maximum's term is exp(0) = 1, so l >= 1. */
  const bool empty = hi <= lo;
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    StoreAt(p.o, ob + d * os, empty ? 0.0f : acc[d] / l);
  }
  static_cast<float*>(p.lse.data)[LseOffset(p, tq, h)] = empty ? NegInf() : m + logf(l);
}

/* D_i = sum_d dO_id O_id for query row i (fp32, the order of d). */
ATTEST_HD void DeltaRow(const Params& p, int64_t b, int64_t h, int64_t i) {
  const Seq s = SeqOf(p, b);
  if (i >= s.q_len) return;
  const int64_t tq = s.q_begin + i;
  const int64_t dob = TokenOffset(p, p.dout, tq, p.seqlen_q, h, 0), dos = DimStride(p, p.dout);
  const int64_t ob = TokenOffset(p, p.o, tq, p.seqlen_q, h, 0), os = DimStride(p, p.o);
  float acc = 0.0f;
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    acc = fmaf(LoadAt(p.dout, dob + d * dos),
               LoadAt(p.o, ob + d * os), acc);
  }
  p.delta[DeltaIndex(p, tq, h)] = acc;
}

/* dS_ij / scale-free: P_ij (dP_ij - D_i) times the softcap derivative 1 - tanh^2. */
ATTEST_HD float DScore(float pij, float dp, float delta_i, float t, float softcap) {
  float ds = pij * (dp - delta_i);
  if (softcap > 0.0f) ds *= 1.0f - t * t;
  return ds;
}

/* dq for query row i: sum_j dS_ij k_j, times scale. Needs DeltaRow first. */
ATTEST_HD void DqRow(const Params& p, int64_t b, int64_t h, int64_t i) {
  const Seq s = SeqOf(p, b);
  if (i >= s.q_len) return;
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int64_t tq = s.q_begin + i;
  const int64_t qb = TokenOffset(p, p.q, tq, p.seqlen_q, h, 0), qs = DimStride(p, p.q);
  const int64_t dob = TokenOffset(p, p.dout, tq, p.seqlen_q, h, 0), dos = DimStride(p, p.dout);
  const int64_t dqb = TokenOffset(p, p.dq, tq, p.seqlen_q, h, 0), dqs = DimStride(p, p.dq);
  float qf[kMaxHeadDim];
  float dof[kMaxHeadDim];
  float dq[kMaxHeadDim];
  for (int64_t d = 0; d < p.head_dim; ++d) {
    qf[d] = LoadAt(p.q, qb + d * qs);
    dq[d] = 0.0f;
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    dof[d] = LoadAt(p.dout, dob + d * dos);
  }
  const float lse = static_cast<const float*>(p.lse.data)[LseOffset(p, tq, h)];
  const float delta = p.delta[DeltaIndex(p, tq, h)];
  int64_t lo, hi;
  KeyRange(p, s, i, &lo, &hi);
  if (lse == NegInf()) hi = lo; /* an empty row: dq = 0 */
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t tk = s.k_begin + j;
    const int64_t kb = TokenOffset(p, p.k, tk, p.seqlen_k, hk, 0), ks = DimStride(p, p.k);
    const int64_t vb = TokenOffset(p, p.v, tk, p.seqlen_k, hk, 0), vs = DimStride(p, p.v);
    float dot = 0.0f, dp = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) {
      dot = fmaf(qf[d], LoadAt(p.k, kb + d * ks), dot);
    }
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      dp = fmaf(dof[d], LoadAt(p.v, vb + d * vs), dp);
    }
    float t;
    const float x = Score(p, s, h, i, j, dot, &t);
    const float ds = DScore(expf(x - lse), dp, delta, t, p.softcap);
    for (int64_t d = 0; d < p.head_dim; ++d) {
      dq[d] = fmaf(ds, LoadAt(p.k, kb + d * ks), dq[d]);
    }
  }
  for (int64_t d = 0; d < p.head_dim; ++d) {
    StoreAt(p.dq, dqb + d * dqs, dq[d] * p.scale);
  }
}

/* Query head h's share of dk and dv for key row j of sequence b (kv head h / group): sums
 * over the queries that see j, in query order, unscaled, into dk_part / dv_part. Needs
 * DeltaRow first. */
ATTEST_HD void DkDvPartRow(const Params& p, int64_t b, int64_t h, int64_t j) {
  const Seq s = SeqOf(p, b);
  if (j >= s.k_len) return;
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int64_t tk = s.k_begin + j;
  const int64_t kb = TokenOffset(p, p.k, tk, p.seqlen_k, hk, 0), ks = DimStride(p, p.k);
  const int64_t vb = TokenOffset(p, p.v, tk, p.seqlen_k, hk, 0), vs = DimStride(p, p.v);
  float kf[kMaxHeadDim];
  float vf[kMaxHeadDim];
  float dk[kMaxHeadDim];
  float dv[kMaxHeadDim];
  for (int64_t d = 0; d < p.head_dim; ++d) {
    kf[d] = LoadAt(p.k, kb + d * ks);
    dk[d] = 0.0f;
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    vf[d] = LoadAt(p.v, vb + d * vs);
    dv[d] = 0.0f;
  }
  int64_t lo, hi;
  QueryRange(p, s, j, &lo, &hi);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t tq = s.q_begin + i;
    const int64_t qb = TokenOffset(p, p.q, tq, p.seqlen_q, h, 0), qs = DimStride(p, p.q);
    const int64_t dob = TokenOffset(p, p.dout, tq, p.seqlen_q, h, 0), dos = DimStride(p, p.dout);
    const float lse = static_cast<const float*>(p.lse.data)[LseOffset(p, tq, h)];
    if (lse == NegInf()) continue;
    float dot = 0.0f, dp = 0.0f;
    for (int64_t d = 0; d < p.head_dim; ++d) {
      dot = fmaf(LoadAt(p.q, qb + d * qs), kf[d], dot);
    }
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      dp = fmaf(LoadAt(p.dout, dob + d * dos), vf[d], dp);
    }
    float t;
    const float x = Score(p, s, h, i, j, dot, &t);
    const float pij = expf(x - lse);
    const float ds = DScore(pij, dp, p.delta[DeltaIndex(p, tq, h)], t, p.softcap);
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      dv[d] = fmaf(pij, LoadAt(p.dout, dob + d * dos), dv[d]);
    }
    for (int64_t d = 0; d < p.head_dim; ++d) {
      dk[d] = fmaf(ds, LoadAt(p.q, qb + d * qs), dk[d]);
    }
  }
  const int64_t row = h * TotalK(p) + tk;
  for (int64_t d = 0; d < p.head_dim; ++d) p.dk_part[row * p.head_dim + d] = dk[d];
  for (int64_t d = 0; d < p.head_dim_v; ++d) p.dv_part[row * p.head_dim_v + d] = dv[d];
}

/* The sum of x[0 .. n) (stride `stride`) folded symmetrically: x_k + x_(n-1-k) first, then
 * the same on the halves. Reversing x gives the same bits (every addition meets the same
 * two operands, and a + b = b + a exactly), so a permutation that reverses the query heads
 * of a group leaves dk and dv bitwise unchanged, as the permutation check requires of a
 * deterministic kernel. */
ATTEST_HD float FoldSum(const float* x, int64_t n, int64_t stride) {
  float tmp[kMaxGroup / 2 + 1];
  int64_t m = (n + 1) / 2;
  for (int64_t k = 0; k < n / 2; ++k) tmp[k] = x[k * stride] + x[(n - 1 - k) * stride];
  if (n % 2 == 1) tmp[n / 2] = x[(n / 2) * stride];
  while (m > 1) {
    for (int64_t k = 0; k < m / 2; ++k) tmp[k] = tmp[k] + tmp[m - 1 - k];
    m = (m + 1) / 2; /* an odd middle element stays at index m / 2 = new m - 1 */
  }
  return n > 0 ? tmp[0] : 0.0f;
}

/* dk, dv for key row j of sequence b, kv head hk: the group's shares folded, scaled and
 * rounded once. Needs DkDvPartRow for every query head of the group first. */
ATTEST_HD void DkDvReduceRow(const Params& p, int64_t b, int64_t hk, int64_t j) {
  const Seq s = SeqOf(p, b);
  if (j >= s.k_len) return;
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t tk = s.k_begin + j;
  const int64_t dkb = TokenOffset(p, p.dk, tk, p.seqlen_k, hk, 0), dks = DimStride(p, p.dk);
  const int64_t dvb = TokenOffset(p, p.dv, tk, p.seqlen_k, hk, 0), dvs = DimStride(p, p.dv);
  const int64_t first = hk * group * TotalK(p) + tk; /* row of head hk * group */
  const int64_t head_stride = TotalK(p);
  for (int64_t d = 0; d < p.head_dim; ++d) {
    const float sum = FoldSum(p.dk_part + first * p.head_dim + d, group, head_stride * p.head_dim);
    StoreAt(p.dk, dkb + d * dks, sum * p.scale);
  }
  for (int64_t d = 0; d < p.head_dim_v; ++d) {
    const float sum =
        FoldSum(p.dv_part + first * p.head_dim_v + d, group, head_stride * p.head_dim_v);
    StoreAt(p.dv, dvb + d * dvs, sum);
  }
}

}  // namespace attest_example

#endif /* ATTEST_EXAMPLES_FLASH_ROWS_H_ */
