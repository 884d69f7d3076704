// Properties of the non-interference check family (verify/checks/noninterference.h) over
// every cpu/ model: outputs of rows that must not see a set of inputs (future keys, keys
// outside the window, other documents or sequences) are bitwise unchanged when those inputs
// are perturbed, on cases drawn inside the model's capabilities.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "property_tests/check_props.h"

namespace attest {
namespace {

RC_GTEST_PROP(NonInterferenceProperties, NoCpuModelLetsAMaskedInputMoveAVisibleOutput, ()) {
  CheckHoldsOnCpuModels("non-interference");
}

}  // namespace
}  // namespace attest
