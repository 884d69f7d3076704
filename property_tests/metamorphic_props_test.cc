// Properties of the metamorphic check family (verify/checks/metamorphic.h) over every cpu/
// model: GQA equals MHA with repeated k/v, permuting batch entries and heads permutes the
// outputs, window (Sk, 0) equals causal, and padding masked by document ids changes nothing.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "property_tests/check_props.h"

namespace attest {
namespace {

RC_GTEST_PROP(MetamorphicProperties, GqaEqualsMhaWithKeysAndValuesRepeatedPerGroup, ()) {
  CheckHoldsOnCpuModels("gqa-mha");
}

RC_GTEST_PROP(MetamorphicProperties, PermutingBatchEntriesAndHeadsPermutesTheOutputs, ()) {
  CheckHoldsOnCpuModels("permutation");
}

RC_GTEST_PROP(MetamorphicProperties, AWindowOfSkLeftAndZeroRightEqualsCausal, ()) {
  CheckHoldsOnCpuModels("window-causal");
}

RC_GTEST_PROP(MetamorphicProperties, PaddingMaskedByDocumentIdsLeavesRealTokensUnchanged, ()) {
  CheckHoldsOnCpuModels("padding");
}

}  // namespace
}  // namespace attest
