// Multiprecision scalar types of the oracle (docs/design.md "Oracle": boost::multiprecision, MPFR
// back end, 128-256 bits), with a cpp_bin_float fallback where MPFR is absent.
//
// mpfr_float_backend<N> takes decimal digits and asks MPFR for
// digits10_2_2(N) = floor(1000 N / 301) + (1000 N % 301 ? 2 : 1) bits
// (boost/multiprecision/detail/digits.hpp, Boost 1.74): N = 38 gives exactly 128 bits; no N
// gives exactly 256 (76 -> 254, 77 -> 257), so "mp256" is N = 77, 257 bits (>= 256). The
// fallback uses binary-digit cpp_bin_float with exactly 128 and 257 bits so that both back
// ends carry the same precision.
#pragma once

#include <boost/multiprecision/number.hpp>

#include "reference/oracle/oracle.h"

#if ATTEST_ORACLE_HAVE_MPFR
#include <boost/multiprecision/mpfr.hpp>
#else
#include <boost/multiprecision/cpp_bin_float.hpp>
#endif

namespace attest {

inline constexpr int kMp128Bits = 128;
inline constexpr int kMp256Bits = 257;

#if ATTEST_ORACLE_HAVE_MPFR
// Expression templates off: the oracle's loops are short expressions, and et_off keeps
// `auto` safe and compile time lower.
using Mp128 = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<38>,
                                            boost::multiprecision::et_off>;
using Mp256 = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<77>,
                                            boost::multiprecision::et_off>;
#else
using Mp128 = boost::multiprecision::number<
    boost::multiprecision::cpp_bin_float<kMp128Bits, boost::multiprecision::digit_base_2>,
    boost::multiprecision::et_off>;
using Mp256 = boost::multiprecision::number<
    boost::multiprecision::cpp_bin_float<kMp256Bits, boost::multiprecision::digit_base_2>,
    boost::multiprecision::et_off>;
#endif

// The oracle's MP entry points are explicit specializations (oracle_mp128.cc,
// oracle_mp256.cc), declared here so that every caller sees them before use.
template <>
ForwardOut Forward<Mp128>(const Problem&, const Tensor&, const Tensor&, const Tensor&,
                          const OracleOptions&);
template <>
ForwardOut Forward<Mp256>(const Problem&, const Tensor&, const Tensor&, const Tensor&,
                          const OracleOptions&);
template <>
BackwardOut Backward<Mp128>(const Problem&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const OracleOptions&);
template <>
BackwardOut Backward<Mp256>(const Problem&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const OracleOptions&);

}  // namespace attest
