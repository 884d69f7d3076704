// The same-precision "pt" reference (see baseline.h for the rounding points and sources) and
// the profiles' choice of baseline; the recipe reference is recipe_reference.cc.
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

// The buffers of one sequence (batch entry) of a run: per-head buffers, reused: scaled q',
// softmax output (rounded, and fp32 for ALiBi), tanh values for the softcap backward,
// visibility (whole runs; row-wise they are the workers' rows), and the per-head copies of k
// and v in both orientations, so that every sum below runs over contiguous memory with
// independent accumulators per output element (vectorisable while each element's own sum stays
// sequential in its index, the order documented above).
struct SeqBuffers {
  SeqBuffers(const MaskView& mask, int64_t b, bool rowwise, bool backward, bool alibi, float cap,
             int64_t D, int64_t Dv, bool rel_bias)
      : mask(mask), b(b), seq(mask.sequence()), nq(seq.q_len), nk(seq.k_len) {
    qs.resize(static_cast<size_t>(nq * D));
    const int64_t area = rowwise ? 0 : nq * nk;
    pr.resize(static_cast<size_t>(area));
    vis.resize(static_cast<size_t>(area));
    if (!rowwise) TileVisibility(mask, 0, nq, 0, nk, vis);  // the same for every head
    dk_acc.resize(static_cast<size_t>(nk * D));
    dv_acc.resize(static_cast<size_t>(nk * Dv));
    dk_group.resize(static_cast<size_t>(nk * D));
    dv_group.resize(static_cast<size_t>(nk * Dv));
    if (alibi) p32.assign(static_cast<size_t>(area), 0.0f);
    if (cap > 0) th.assign(static_cast<size_t>(area), 0.0f);
    // dS of a block of rows (backward).
    dsb.resize(backward ? static_cast<size_t>(std::min(nq, kRowBlock) * nk) : 0);
    // The block's fp32 dS before the softcap derivative (backward with a relative bias).
    if (backward && rel_bias) drb.assign(static_cast<size_t>(std::min(nq, kRowBlock) * nk), 0.0f);
    // A sink's probability per row and each row's dsink term (backward).
    psink.assign(static_cast<size_t>(nq), 0.0f);
    dsink_rows.assign(backward ? static_cast<size_t>(nq) : 0, 0.0f);
    kh.resize(static_cast<size_t>(nk * D));
    kt.resize(static_cast<size_t>(D * nk));
    vh.resize(static_cast<size_t>(nk * Dv));
    vt.resize(static_cast<size_t>(Dv * nk));
    qs32.resize(static_cast<size_t>(nq * D));
  }

  const MaskView& mask;
  const int64_t b;
  const Sequence seq;
  const int64_t nq, nk;
  std::vector<float> qs, pr, p32, th;
  std::vector<uint8_t> vis;
  std::vector<float> dk_acc, dv_acc, dk_group, dv_group;
  std::vector<float> dsb, drb;
  std::vector<float> psink, dsink_rows;
  std::vector<float> kh, kt, vh, vt;
  std::vector<float> qs32;
  int64_t loaded_kv = -1;
};

// One run of the same-precision reference (Run below checks its arguments first): the inputs
// as floats, the outputs and each worker's buffers; Compute walks (batch, query head), the
// forward one row at a time, the backward in blocks of kRowBlock rows.
class SdpaRun {
 public:
  SdpaRun(const Problem& p, Format f, const Tensor& q, const Tensor& k, const Tensor& v,
          const Tensor* dout, BaselineMode mode, const std::vector<uint8_t>* query_rows,
          int threads, const Tensor* sink, const Tensor* rel_bias)
      : p_(p),
        f_(f),
        every_op_(mode == BaselineMode::kEveryOp),
        backward_(dout != nullptr),
        query_rows_(query_rows),
        rowwise_(query_rows != nullptr),
        threads_(threads),
        workers_(oracle_internal::ThreadCount(threads)),
        H_(p.heads_q),
        Hk_(p.heads_kv),
        D_(p.head_dim),
        Dv_(p.head_dim_v),
        TQ_(p.TotalQ()),
        TK_(p.TotalK()),
        qf_(ToFloats(q)),
        kf_(ToFloats(k)),
        vf_(ToFloats(v)),
        dof_(backward_ ? ToFloats(*dout) : std::vector<float>{}),
        default_scale_(!p.scale.has_value()),
        scale_f_(static_cast<float>(p.EffectiveScale())),
        sqrt_d_(std::sqrt(static_cast<float>(D_))),
        cap_(static_cast<float>(p.softcap)),
        alibi_(p.alibi_slopes.has_value()),
        sink_(sink != nullptr ? ToFloats(*sink) : std::vector<float>{}),
        rb_(rel_bias != nullptr ? ToFloats(*rel_bias) : std::vector<float>{}),
        W_(p.RelBiasWidth()),
        promoted_(alibi_ || !rb_.empty()) {
    o_.assign(static_cast<size_t>(TQ_ * H_ * Dv_), 0.0f);
    lse_.assign(static_cast<size_t>(TQ_ * H_), kNegInf);
    if (backward_) {
      dq_.assign(static_cast<size_t>(TQ_ * H_ * D_), 0.0f);
      dk_.assign(static_cast<size_t>(TK_ * Hk_ * D_), 0.0f);
      dv_.assign(static_cast<size_t>(TK_ * Hk_ * Dv_), 0.0f);
      if (!sink_.empty()) dsink_.assign(static_cast<size_t>(H_), 0.0f);
      if (!rb_.empty()) drel_.assign(static_cast<size_t>(H_ * W_), 0.0f);
    }
    scratch_.resize(static_cast<size_t>(workers_));  // sized on first use
  }

  BaselineOut Compute();

 private:
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // Per-worker buffers: a row's scores (s, s32), an output row's sums (acc_d) and, row-wise,
  // the row's visibility, probabilities and tanh values.
  struct Scratch {
    int64_t batch = -1;  // the sequence the buffers are sized for
    std::vector<float> s, s32, acc_d, pr, p32, th;
    std::vector<uint8_t> vis;
  };

  // R(): an output rounded once to the dtype; Ri(): the same for an intermediate tensor op,
  // which only the every-op mode rounds (the SDPA math backend keeps intermediates in fp32).
  float R(float x) const {
    return f_ == Format::kF32 ? x : static_cast<float>(RoundTo(static_cast<double>(x), f_));
  }
  float Ri(float x) const { return every_op_ ? R(x) : x; }
  void Parallel(int64_t items, const std::function<void(int64_t, int)>& fn) const {
    oracle_internal::ParallelFor(items, oracle_internal::ThreadCount(threads_, items), fn);
  }
  // fn(j0, j1) over [0, n) in chunks of kKeyChunk, in parallel.
  void Chunked(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const {
    Parallel((n + kKeyChunk - 1) / kKeyChunk, [&](int64_t c, int) {
      fn(c * kKeyChunk, std::min(n, (c + 1) * kKeyChunk));
    });
  }
  float& LseAt(int64_t b, int64_t h, int64_t t, int64_t i) {
    // [B, H, Sq] padded; [H, total_q] packed.
    const int64_t off = p_.varlen() ? h * TQ_ + t : (b * H_ + h) * p_.seqlen_q + i;
    return lse_[static_cast<size_t>(off)];
  }
  const float* QRow(const SeqBuffers& sb, int64_t h, int64_t i) const {
    return &qf_[static_cast<size_t>(((sb.seq.q_begin + i) * H_ + h) * D_)];
  }
  const float* DoRow(const SeqBuffers& sb, int64_t h, int64_t i) const {
    return &dof_[static_cast<size_t>(((sb.seq.q_begin + i) * H_ + h) * Dv_)];
  }

  Scratch& Ready(const SeqBuffers& sb, int worker);
  void LoadKv(SeqBuffers& sb, int64_t hk);
  void ScaleQ(SeqBuffers& sb, int64_t h);
  void ForwardRow(SeqBuffers& sb, int64_t h, float slope, int64_t i, int worker);
  void RowScores(SeqBuffers& sb, int64_t i, int64_t j_lo, int64_t j_hi, Scratch& w);
  void Backward(SeqBuffers& sb, int64_t h, int64_t hk);
  void BackwardRow(SeqBuffers& sb, int64_t h, int64_t i0, int64_t r, int worker);
  void AccumulateRelBias(SeqBuffers& sb, int64_t h, int64_t i0, int64_t i1);
  void AccumulateKeyGrads(SeqBuffers& sb, int64_t h, int64_t i0, int64_t i1, int64_t j0,
                          int64_t j1);
  void ReduceGroup(SeqBuffers& sb, int64_t h, int64_t hk, int64_t j0, int64_t j1);

  const Problem& p_;
  const Format f_;
  const bool every_op_;
  const bool backward_;
  const std::vector<uint8_t>* query_rows_;
  const bool rowwise_;
  const int threads_;
  const int workers_;
  const int64_t H_, Hk_, D_, Dv_;
  const int64_t TQ_, TK_;
  const std::vector<float> qf_, kf_, vf_;
  const std::vector<float> dof_;
  const bool default_scale_;
  const float scale_f_;
  const float sqrt_d_;
  const float cap_;
  const bool alibi_;
  const std::vector<float> sink_;  // [Hq] fp32, empty without a sink
  const std::vector<float> rb_;    // [Hq, W] fp32 relative bias, empty without one
  const int64_t W_;
  // fp32 scores (an fp32 bias tensor promotes them): the softmax's output is fp32.
  const bool promoted_;

  std::vector<float> o_;
  std::vector<float> lse_;
  std::vector<float> dq_, dk_, dv_, dsink_, drel_;
  std::vector<Scratch> scratch_;
};

SdpaRun::Scratch& SdpaRun::Ready(const SeqBuffers& sb, int worker) {
  Scratch& w = scratch_[static_cast<size_t>(worker)];
  if (w.batch == sb.b) return w;
  const int64_t nk = sb.nk;
  w.batch = sb.b;
  w.s.assign(static_cast<size_t>(nk), 0.0f);
  w.s32.assign(static_cast<size_t>(nk), 0.0f);
  w.acc_d.assign(static_cast<size_t>(std::max(D_, Dv_)), 0.0f);
  if (rowwise_) {
    w.pr.assign(static_cast<size_t>(nk), 0.0f);
    w.vis.assign(static_cast<size_t>(nk), 0);
    if (promoted_) w.p32.assign(static_cast<size_t>(nk), 0.0f);
    if (cap_ > 0) w.th.assign(static_cast<size_t>(nk), 0.0f);
  }
  return w;
}

BaselineOut SdpaRun::Compute() {
  for (int64_t b = 0; b < p_.batch; ++b) {
    const MaskView mask(p_, b);
    SeqBuffers sb(mask, b, rowwise_, backward_, promoted_, cap_, D_, Dv_, !rb_.empty());
    for (int64_t h = 0; h < H_; ++h) {
      const int64_t hk = p_.KvHead(h);
      const float slope =
          alibi_ ? static_cast<float>((*p_.alibi_slopes)[static_cast<size_t>(h)]) : 0;
      if (hk != sb.loaded_kv) {
        LoadKv(sb, hk);
        sb.loaded_kv = hk;
      }
      ScaleQ(sb, h);
      std::fill(sb.pr.begin(), sb.pr.end(), 0.0f);
      // ---- forward: one row at a time, rows in parallel ----
      Parallel(sb.nq, [&](int64_t i, int worker) { ForwardRow(sb, h, slope, i, worker); });
      if (!backward_) continue;
      Backward(sb, h, hk);
    }
  }

  BaselineOut out;
  out.o = FromFloats(p_.OShape(), o_);
  out.lse = FromFloats(p_.LseShape(), lse_);
  if (backward_) {
    out.dq = FromFloats(p_.QShape(), dq_);
    out.dk = FromFloats(p_.KShape(), dk_);
    out.dv = FromFloats(p_.VShape(), dv_);
    if (!sink_.empty()) out.dsink = FromFloats(Shape{H_}, dsink_);
    if (!rb_.empty()) out.drel_bias = FromFloats(p_.RelBiasShape(), drel_);
  }
  return out;
}

// Kv head hk's k and v rows of the sequence into kh / kt and vh / vt.
void SdpaRun::LoadKv(SeqBuffers& sb, int64_t hk) {
  const int64_t nk = sb.nk;
  Chunked(nk, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const float* kr = &kf_[static_cast<size_t>(((sb.seq.k_begin + j) * Hk_ + hk) * D_)];
      const float* vr = &vf_[static_cast<size_t>(((sb.seq.k_begin + j) * Hk_ + hk) * Dv_)];
      for (int64_t d = 0; d < D_; ++d) {
        sb.kh[static_cast<size_t>(j * D_ + d)] = kr[d];
        sb.kt[static_cast<size_t>(d * nk + j)] = kr[d];
      }
      for (int64_t e = 0; e < Dv_; ++e) {
        sb.vh[static_cast<size_t>(j * Dv_ + e)] = vr[e];
        sb.vt[static_cast<size_t>(e * nk + j)] = vr[e];
      }
    }
  });
}

// q' (dtype-rounded in every-op mode) and its fp32 counterpart for lse.
void SdpaRun::ScaleQ(SeqBuffers& sb, int64_t h) {
  for (int64_t i = 0; i < sb.nq; ++i) {
    for (int64_t d = 0; d < D_; ++d) {
      const float x = QRow(sb, h, i)[d];
      const float x32 = default_scale_ ? x / sqrt_d_ : x * scale_f_;
      sb.qs32[static_cast<size_t>(i * D_ + d)] = x32;
      sb.qs[static_cast<size_t>(i * D_ + d)] = Ri(x32);
    }
  }
}

// Raw scores of row i against the keys [j_lo, j_hi): s_j = sum_d q'_d k_jd, sequential in d
// (and, in every-op mode, the fp32 ones in s32).
void SdpaRun::RowScores(SeqBuffers& sb, int64_t i, int64_t j_lo, int64_t j_hi, Scratch& w) {
  const int64_t nk = sb.nk;
  std::vector<float>& s = w.s;
  std::vector<float>& s32 = w.s32;
  std::fill(s.begin(), s.end(), 0.0f);
  for (int64_t d = 0; d < D_; ++d) {
    const float a = sb.qs[static_cast<size_t>(i * D_ + d)];
    const float* kd = sb.kt.data() + d * nk;
    for (int64_t j = j_lo; j < j_hi; ++j) s[static_cast<size_t>(j)] += a * kd[j];
  }
  if (every_op_) {
    std::fill(s32.begin(), s32.end(), 0.0f);
    for (int64_t d = 0; d < D_; ++d) {
      const float a = sb.qs32[static_cast<size_t>(i * D_ + d)];
      const float* kd = sb.kt.data() + d * nk;
      for (int64_t j = j_lo; j < j_hi; ++j) s32[static_cast<size_t>(j)] += a * kd[j];
    }
  } else {
    s32 = s;  // the SDPA math path's scores are the fp32 ones
  }
}

// Row i of head h: scores, softmax, lse and o.
void SdpaRun::ForwardRow(SeqBuffers& sb, int64_t h, float slope, int64_t i, int worker) {
  Scratch& w = Ready(sb, worker);
  std::vector<float>& s = w.s;
  std::vector<float>& s32 = w.s32;
  const int64_t nk = sb.nk;
  const int64_t t = sb.seq.q_begin + i;
  if (rowwise_ && !(*query_rows_)[static_cast<size_t>(t)]) return;
  if (!sink_.empty()) sb.psink[static_cast<size_t>(i)] = 0;
  // Row i's visibility, probabilities, fp32 probabilities and tanh values; and the keys
  // whose scores are read.
  uint8_t* vis_i = rowwise_ ? w.vis.data() : sb.vis.data() + i * nk;
  float* pr_i = rowwise_ ? w.pr.data() : sb.pr.data() + i * nk;
  float* p32_i = !promoted_ ? nullptr : rowwise_ ? w.p32.data() : sb.p32.data() + i * nk;
  float* th_i = cap_ <= 0 ? nullptr : rowwise_ ? w.th.data() : sb.th.data() + i * nk;
  int64_t j_lo = 0, j_hi = nk;
  if (rowwise_) {
    std::tie(j_lo, j_hi) = sb.mask.KeyBounds(i);
    RowVisibility(sb.mask, i, 0, nk, vis_i);
  }
  RowScores(sb, i, j_lo, j_hi, w);
  float m = kNegInf, m32 = kNegInf;
  for (int64_t j = 0; j < nk; ++j) {
    if (!vis_i[j]) continue;
    float sj = Ri(s[static_cast<size_t>(j)]);
    float sj32 = s32[static_cast<size_t>(j)];
    if (cap_ > 0) {
      const float tj = Ri(std::tanh(Ri(sj / cap_)));
      th_i[j] = tj;
      sj = Ri(tj * cap_);
      sj32 = cap_ * std::tanh(sj32 / cap_);
    }
    if (alibi_) {
      const float bias = -slope * static_cast<float>(sb.mask.AlibiDistance(i, j));
      sj = sj + bias;  // fp32 result: the bias tensor promotes the scores
      sj32 = sj32 + bias;
    }
    if (!rb_.empty()) {  // the relative bias, last (sequence-local i - j; baseline.h)
      const float r = rb_[static_cast<size_t>(h * W_ + p_.seqlen_k - 1 + i - j)];
      sj = sj + r;
      sj32 = sj32 + r;
    }
    s[static_cast<size_t>(j)] = sj;
    s32[static_cast<size_t>(j)] = sj32;
    m = std::max(m, sj);
    m32 = std::max(m32, sj32);
  }
  // The sink: the last column of the row (see baseline.h); -inf adds nothing.
  const float sink = sink_.empty() ? kNegInf : sink_[static_cast<size_t>(h)];
  m = std::max(m, sink);
  m32 = std::max(m32, sink);
  if (m == kNegInf) return;  // empty row: p = 0, o = 0, lse = -inf
  float sum = 0, sum32 = 0;
  for (int64_t j = 0; j < nk; ++j) {
    if (!vis_i[j]) continue;
    const float e = std::exp(s[static_cast<size_t>(j)] - m);
    s[static_cast<size_t>(j)] = e;
    sum += e;
    sum32 += std::exp(s32[static_cast<size_t>(j)] - m32);
  }
  if (sink != kNegInf) {
    const float e = std::exp(sink - m);
    sum += e;
    sum32 += std::exp(sink - m32);
    sb.psink[static_cast<size_t>(i)] = e / sum;
  }
  for (int64_t j = 0; j < nk; ++j) {
    if (!vis_i[j]) continue;
    const float pj = s[static_cast<size_t>(j)] / sum;
    if (promoted_) p32_i[j] = pj;
    pr_i[j] = Ri(pj);
  }
  LseAt(sb.b, h, t, i) = m32 + std::log(sum32);
  // o_e = sum_j p_j v_je, sequential in j (masked keys add exact zeros: skipped).
  std::vector<float>& acc_d = w.acc_d;
  std::fill(acc_d.begin(), acc_d.begin() + Dv_, 0.0f);
  for (int64_t j = 0; j < nk; ++j) {
    if (!vis_i[j]) continue;
    const float pj = pr_i[j];
    const float* vr = &sb.vh[static_cast<size_t>(j * Dv_)];
    for (int64_t e = 0; e < Dv_; ++e) acc_d[static_cast<size_t>(e)] += pj * vr[e];
  }
  for (int64_t e = 0; e < Dv_; ++e) {
    o_[static_cast<size_t>((t * H_ + h) * Dv_ + e)] = R(acc_d[static_cast<size_t>(e)]);
  }
}

// The backward of head h: blocks of kRowBlock rows (their dP, dS and dq rows in parallel, then
// dk and dv over key chunks), then the head's gradients into its group's.
void SdpaRun::Backward(SeqBuffers& sb, int64_t h, int64_t hk) {
  const int64_t nq = sb.nq, nk = sb.nk;
  std::fill(sb.dk_acc.begin(), sb.dk_acc.end(), 0.0f);
  std::fill(sb.dv_acc.begin(), sb.dv_acc.end(), 0.0f);
  for (int64_t i0 = 0; i0 < nq; i0 += kRowBlock) {
    const int64_t i1 = std::min(nq, i0 + kRowBlock);
    Parallel(i1 - i0, [&](int64_t r, int worker) { BackwardRow(sb, h, i0, r, worker); });
    if (!rb_.empty()) AccumulateRelBias(sb, h, i0, i1);
    Chunked(nk, [&](int64_t j0, int64_t j1) { AccumulateKeyGrads(sb, h, i0, i1, j0, j1); });
  }
  Chunked(nk, [&](int64_t j0, int64_t j1) { ReduceGroup(sb, h, hk, j0, j1); });
  if (!sink_.empty()) {
    float& dsink = dsink_[static_cast<size_t>(h)];
    for (int64_t i = 0; i < nq; ++i) dsink += sb.dsink_rows[static_cast<size_t>(i)];
  }
}

// Row i0 + r of the block: dP, dS (into the block's dsb) and dq.
void SdpaRun::BackwardRow(SeqBuffers& sb, int64_t h, int64_t i0, int64_t r, int worker) {
  const int64_t nk = sb.nk;
  const std::vector<uint8_t>& vis = sb.vis;
  const std::vector<float>& pout = promoted_ ? sb.p32 : sb.pr;
  const int64_t i = i0 + r;
  const int64_t t = sb.seq.q_begin + i;
  const float* g = DoRow(sb, h, i);
  float* ds = sb.dsb.data() + r * nk;
  // dP_j = sum_e dO_e v_je (sequential in e), then the softmax backward from its
  // (rounded, or fp32 with ALiBi) output.
  std::fill(ds, ds + nk, 0.0f);
  for (int64_t e = 0; e < Dv_; ++e) {
    const float a = g[e];
    const float* ve = sb.vt.data() + e * nk;
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
  // The sink column's dS: its dP is 0.
  if (!sink_.empty()) {
    sb.dsink_rows[static_cast<size_t>(i)] = -(sb.psink[static_cast<size_t>(i)] * rowdot);
  }
  for (int64_t j = 0; j < nk; ++j) {
    if (!vis[static_cast<size_t>(i * nk + j)]) continue;
    const float pj = pout[static_cast<size_t>(i * nk + j)];
    const float ds32 = pj * (ds[j] - rowdot);  // the fp32 score's gradient
    if (!rb_.empty()) sb.drb[static_cast<size_t>(r * nk + j)] = ds32;
    float dsj = Ri(ds32);
    if (cap_ > 0) {
      const float tj = sb.th[static_cast<size_t>(i * nk + j)];
      dsj = Ri(Ri(Ri(dsj * cap_) * (1.0f - tj * tj)) / cap_);
    }
    ds[j] = dsj;
  }
  // dq'_d = sum_j dS_j k_jd (sequential in j), then the scale's backward.
  std::vector<float>& acc_d = Ready(sb, worker).acc_d;
  std::fill(acc_d.begin(), acc_d.begin() + D_, 0.0f);
  for (int64_t j = 0; j < nk; ++j) {
    if (!vis[static_cast<size_t>(i * nk + j)]) continue;
    const float dsj = ds[j];
    const float* kr = &sb.kh[static_cast<size_t>(j * D_)];
    for (int64_t d = 0; d < D_; ++d) acc_d[static_cast<size_t>(d)] += dsj * kr[d];
  }
  for (int64_t d = 0; d < D_; ++d) {
    const float gq = Ri(acc_d[static_cast<size_t>(d)]);
    dq_[static_cast<size_t>((t * H_ + h) * D_ + d)] =
        default_scale_ ? R(gq / sqrt_d_) : R(gq * scale_f_);
  }
}

// drel_bias[h, Sk - 1 + i - j] += the fp32 dS of (i, j) for the block's rows [i0, i1), row by
// row, keys in order (index_put's accumulate backward of the bias gather, sequential).
void SdpaRun::AccumulateRelBias(SeqBuffers& sb, int64_t h, int64_t i0, int64_t i1) {
  const int64_t nk = sb.nk;
  float* dr = drel_.data() + h * W_ + p_.seqlen_k - 1;
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = 0; j < nk; ++j) {
      if (!sb.vis[static_cast<size_t>(i * nk + j)]) continue;
      dr[i - j] += sb.drb[static_cast<size_t>((i - i0) * nk + j)];
    }
  }
}

// dk_jd += dS_j q'_d and dv_je += p_j dO_e for the keys [j0, j1), sequential in i (the block's
// rows in order, blocks in order).
void SdpaRun::AccumulateKeyGrads(SeqBuffers& sb, int64_t h, int64_t i0, int64_t i1, int64_t j0,
                                 int64_t j1) {
  const int64_t nk = sb.nk;
  for (int64_t i = i0; i < i1; ++i) {
    const float* g = DoRow(sb, h, i);
    const float* qr = &sb.qs[static_cast<size_t>(i * D_)];
    const float* ds = sb.dsb.data() + (i - i0) * nk;
    for (int64_t j = j0; j < j1; ++j) {
      if (!sb.vis[static_cast<size_t>(i * nk + j)]) continue;
      const float dsj = ds[j];
      const float pj = sb.pr[static_cast<size_t>(i * nk + j)];
      float* dkr = &sb.dk_acc[static_cast<size_t>(j * D_)];
      float* dvr = &sb.dv_acc[static_cast<size_t>(j * Dv_)];
      for (int64_t d = 0; d < D_; ++d) dkr[d] += dsj * qr[d];
      for (int64_t e = 0; e < Dv_; ++e) dvr[e] += pj * g[e];
    }
  }
}

// Per-head gradients are tensors of the dtype; repeat's backward sums them in fp32 (keys
// [j0, j1); the group's last head writes dk and dv).
void SdpaRun::ReduceGroup(SeqBuffers& sb, int64_t h, int64_t hk, int64_t j0, int64_t j1) {
  const bool first_of_group = h % p_.gqa_ratio() == 0;
  const bool last_of_group = h % p_.gqa_ratio() == p_.gqa_ratio() - 1;
  const auto kd0 = static_cast<size_t>(j0 * D_), kd1 = static_cast<size_t>(j1 * D_);
  const auto vd0 = static_cast<size_t>(j0 * Dv_), vd1 = static_cast<size_t>(j1 * Dv_);
  if (first_of_group) {
    std::fill(sb.dk_group.begin() + kd0, sb.dk_group.begin() + kd1, 0.0f);
    std::fill(sb.dv_group.begin() + vd0, sb.dv_group.begin() + vd1, 0.0f);
  }
  for (size_t x = kd0; x < kd1; ++x) sb.dk_group[x] += Ri(sb.dk_acc[x]);
  for (size_t x = vd0; x < vd1; ++x) sb.dv_group[x] += Ri(sb.dv_acc[x]);
  if (!last_of_group) return;
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t tk = sb.seq.k_begin + j;
    for (int64_t d = 0; d < D_; ++d) {
      dk_[static_cast<size_t>((tk * Hk_ + hk) * D_ + d)] =
          R(sb.dk_group[static_cast<size_t>(j * D_ + d)]);
    }
    for (int64_t e = 0; e < Dv_; ++e) {
      dv_[static_cast<size_t>((tk * Hk_ + hk) * Dv_ + e)] =
          R(sb.dv_group[static_cast<size_t>(j * Dv_ + e)]);
    }
  }
}

Expected<BaselineOut> Run(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor* dout, BaselineMode mode,
                          const std::vector<uint8_t>* query_rows, int threads,
                          const Tensor* sink, const Tensor* rel_bias) {
  if (Status s = Validate(p); !s.ok()) return s.error();
  if (Status s = ValidateInputShapes(p, q, k, v, dout); !s.ok()) return s.error();
  if (Status s = ValidateBaselineSink(p, sink); !s.ok()) return s.error();
  if (Status s = ValidateBaselineRelBias(p, rel_bias); !s.ok()) return s.error();
  const auto format = FormatOf(p.dtype);
  if (!format || (*format != Format::kF32 && *format != Format::kBF16 && *format != Format::kF16)) {
    return Error{
        fmt::format("baseline: no same-precision (PyTorch math path) reference for "
                    "dtype {}; profiles for it do not use a baseline ratio",
                    Name(p.dtype))};
  }
  const bool backward = dout != nullptr;
  if (query_rows != nullptr &&
      (backward || static_cast<int64_t>(query_rows->size()) != p.TotalQ())) {
    return Error{"baseline: sampled rows need a forward and one flag per query row"};
  }
  return SdpaRun(p, *format, q, k, v, dout, mode, query_rows, threads, sink, rel_bias).Compute();
}

}  // namespace

Status ValidateBaselineSink(const Problem& p, const Tensor* sink) {
  if (p.sink != (sink != nullptr && sink->defined())) {
    return Error{p.sink ? "problem.sink: the baseline needs the case's sink tensor"
                        : "sink: given for a problem without problem.sink"};
  }
  if (sink != nullptr && sink->defined() &&
      (sink->rank() != 1 || sink->shape()[0] != p.heads_q)) {
    return Error{fmt::format("sink: shape {}, the baseline needs [{}] (heads_q)",
                             sink->rank() == 1 ? std::to_string(sink->shape()[0]) : "rank != 1",
                             p.heads_q)};
  }
  return Status::Ok();
}

Status ValidateBaselineRelBias(const Problem& p, const Tensor* rel_bias) {
  const bool given = rel_bias != nullptr && rel_bias->defined();
  if (p.rel_bias != given) {
    return Error{p.rel_bias ? "problem.rel_bias: the baseline needs the case's rel_bias tensor"
                            : "rel_bias: given for a problem without problem.rel_bias"};
  }
  if (given && rel_bias->shape() != p.RelBiasShape()) {
    return Error{fmt::format("rel_bias: shape {}, the baseline needs [{}, {}] (heads_q, "
                             "seqlen_q + seqlen_k - 1)",
                             rel_bias->Describe(), p.heads_q, p.RelBiasWidth())};
  }
  return Status::Ok();
}

Expected<BaselineOut> BaselineForward(const Problem& p, const Tensor& q, const Tensor& k,
                                      const Tensor& v, BaselineMode mode, int threads,
                                      const Tensor* sink, const Tensor* rel_bias) {
  return Run(p, q, k, v, nullptr, mode, nullptr, threads, sink, rel_bias);
}

Expected<BaselineOut> BaselineBackward(const Problem& p, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& dout, BaselineMode mode,
                                       int threads, const Tensor* sink, const Tensor* rel_bias) {
  return Run(p, q, k, v, &dout, mode, nullptr, threads, sink, rel_bias);
}

Expected<BaselineOut> ProfileBaseline(const Profile& profile, const Problem& p, const Tensor& q,
                                      const Tensor& k, const Tensor& v, const Tensor* dout,
                                      const std::vector<uint8_t>* query_rows, int threads,
                                      const Tensor* sink, const Tensor* rel_bias) {
  if (query_rows != nullptr) {
    if (!profile.baseline_recipe.empty() || dout != nullptr) {
      // (JudgeAgainstOracle names the profile.)
      return Error{"sampled rows have a baseline only for the forward of the same-precision "
                   "path (verify/tolerance/baseline.h); this profile's baseline needs every row"};
    }
    return Run(p, q, k, v, nullptr, BaselineMode::kSdpaMath, query_rows, threads, sink,
               rel_bias);
  }
  if (profile.baseline_recipe.empty()) {
    return dout != nullptr
               ? BaselineBackward(p, q, k, v, *dout, BaselineMode::kSdpaMath, threads, sink,
                                  rel_bias)
               : BaselineForward(p, q, k, v, BaselineMode::kSdpaMath, threads, sink, rel_bias);
  }
  const Recipe* r = FindRecipe(profile.baseline_recipe);
  if (r == nullptr) {
    return Error{fmt::format("profile {}: baseline_recipe '{}' is not a recipe", profile.name,
                             profile.baseline_recipe)};
  }
  return dout != nullptr ? RecipeReferenceBackward(p, *r, q, k, v, *dout, sink, rel_bias)
                         : RecipeReferenceForward(p, *r, q, k, v, sink, rel_bias);
}

}  // namespace attest
