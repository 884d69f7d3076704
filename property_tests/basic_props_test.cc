// Properties of the basic check family (verify/checks/basic.h) over every cpu/ model:
// outputs are written, special values (empty rows, huge logits, format edges) are handled,
// repeat runs are bitwise equal where determinism is claimed, and claimed features are
// answered honestly.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "property_tests/check_props.h"

namespace attest {
namespace {

RC_GTEST_PROP(BasicProperties, EveryCpuModelWritesEveryOutputElement, ()) {
  CheckHoldsOnCpuModels("unwritten-outputs");
}

RC_GTEST_PROP(BasicProperties, EveryCpuModelHandlesEmptyRowsAndFormatEdgeValues, ()) {
  CheckHoldsOnCpuModels("special-values");
}

RC_GTEST_PROP(BasicProperties, EveryCpuModelThatClaimsDeterminismRepeatsBitForBit, ()) {
  CheckHoldsOnCpuModels("determinism");
}

RC_GTEST_PROP(BasicProperties, EveryCpuModelAnswersWhatItClaimsAndAnswersItRight, ()) {
  CheckHoldsOnCpuModels("honesty");
}

}  // namespace
}  // namespace attest
