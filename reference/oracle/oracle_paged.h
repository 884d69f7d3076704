// The oracle on paged and seqused problems (docs/semantics.md "Paged KV and seqused"): the
// used rows are gathered into the logical problem (reference/problem/paged.h LogicalProblem,
// a packed varlen problem), the oracle runs on it, and its outputs are scattered back to the
// problem's layout: o, dq, delta 0 and lse -inf on queries past seqused_q (empty rows), dk,
// dv 0 on pool slots no sequence reads. The logical run is the very run the same logical
// problem gets in contiguous form, so paged and contiguous results are bitwise equal.
#pragma once

#include <limits>
#include <stdexcept>

#include "reference/oracle/oracle.h"
#include "reference/problem/paged.h"

namespace attest::oracle_internal {

inline void CheckLogicalCall(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor* dout, const OracleOptions& options) {
  if (Status s = Validate(p); !s) throw std::invalid_argument("oracle: " + s.error().message);
  if (Status s = ValidateInputShapes(p, q, k, v, dout); !s) {
    throw std::invalid_argument("oracle: " + s.error().message);
  }
  if (options.query_rows != nullptr || options.key_rows != nullptr) {
    throw std::invalid_argument(
        "oracle: sampled rows (OracleOptions::query_rows / key_rows) are not supported on paged "
        "or seqused problems");
  }
}

template <class T>
ForwardOut LogicalForward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                          const OracleOptions& options) {
  CheckLogicalCall(p, q, k, v, nullptr, options);
  const LogicalRows rows = LogicalRowsOf(p);
  ForwardOut out = Forward<T>(LogicalProblem(p), GatherRows(q, rows.q), GatherRows(k, rows.k),
                              GatherRows(v, rows.k), options);
  out.o = ScatterRows(out.o, rows.q, p.OShape(), 0.0);
  out.lse = ScatterLse(p, out.lse, rows.q, -std::numeric_limits<double>::infinity());
  return out;
}

template <class T>
BackwardOut LogicalBackward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& dout, const OracleOptions& options) {
  CheckLogicalCall(p, q, k, v, &dout, options);
  const LogicalRows rows = LogicalRowsOf(p);
  BackwardOut out = Backward<T>(LogicalProblem(p), GatherRows(q, rows.q), GatherRows(k, rows.k),
                                GatherRows(v, rows.k), GatherRows(dout, rows.q), options);
  out.o = ScatterRows(out.o, rows.q, p.OShape(), 0.0);
  out.lse = ScatterLse(p, out.lse, rows.q, -std::numeric_limits<double>::infinity());
  out.delta = ScatterLse(p, out.delta, rows.q, 0.0);
  out.dq = ScatterRows(out.dq, rows.q, p.QShape(), 0.0);
  out.dk = ScatterRows(out.dk, rows.k, p.KShape(), 0.0);
  out.dv = ScatterRows(out.dv, rows.k, p.VShape(), 0.0);
  return out;
}

}  // namespace attest::oracle_internal
