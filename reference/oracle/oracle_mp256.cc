// The oracle for Mp256 (oracle_mp.h): explicit specializations, one precision per file to keep
// compile times and memory in check (oracle_generic.h holds the algorithm).
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_paged.h"
#include "reference/oracle/oracle_generic.h"
#include "reference/oracle/oracle_mp.h"

#if ATTEST_ORACLE_HAVE_MPFR
#include <mpfr.h>
#endif

namespace attest {
namespace {

// MPFR keeps per-thread caches (constants, exp tables) that only the owning thread can
// free; worker threads free theirs before they end.
void FreeThreadCaches() {
#if ATTEST_ORACLE_HAVE_MPFR
  mpfr_free_cache();
#endif
}

}  // namespace

template <>
ForwardOut Forward<Mp256>(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                          const OracleOptions& options) {
  if (HasLogicalView(p)) return oracle_internal::LogicalForward<Mp256>(p, q, k, v, options);
  return oracle_internal::GenericForward<Mp256>(p, q, k, v, options, FreeThreadCaches);
}

template <>
BackwardOut Backward<Mp256>(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& dout, const OracleOptions& options) {
  if (HasLogicalView(p)) {
    return oracle_internal::LogicalBackward<Mp256>(p, q, k, v, dout, options);
  }
  return oracle_internal::GenericBackward<Mp256>(p, q, k, v, dout, options, FreeThreadCaches);
}

}  // namespace attest
