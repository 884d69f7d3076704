// Properties of the accuracy check family (verify/checks/accuracy.h) over every cpu/ model:
// each model's o, lse, dq, dk, dv stay within its tolerance profile of the float64 oracle on
// cases drawn inside its capabilities (run/case_gen.h).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "property_tests/check_props.h"

namespace attest {
namespace {

RC_GTEST_PROP(AccuracyProperties, EveryCpuModelStaysWithinItsToleranceOfTheOracle, ()) {
  CheckHoldsOnCpuModels("accuracy");
}

}  // namespace
}  // namespace attest
