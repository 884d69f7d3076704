// Properties of the forward/backward consistency family (verify/checks/consistency.h) over
// every cpu/ model with a backward: the backward differentiates the forward that ran (delta,
// sum-of-gradient identities, the constant-V probe, the gradient at the quantised operands).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "property_tests/check_props.h"

namespace attest {
namespace {

RC_GTEST_PROP(ConsistencyProperties, EveryCpuBackwardDifferentiatesItsOwnForward, ()) {
  CheckHoldsOnCpuModels("consistency");
}

}  // namespace
}  // namespace attest
