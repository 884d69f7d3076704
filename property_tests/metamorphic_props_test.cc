// Properties of the metamorphic check family (verify/checks/metamorphic.h) over every cpu/
// model: GQA equals MHA with repeated k/v, permuting batch entries and heads permutes the
// outputs, a window reaching key 0 from every diagonal equals causal (and one reaching past
// every key equals no window), and padding masked by document ids changes nothing; on the model
// that declares split counts, every count agrees with the first within the splits-agree bound.
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

RC_GTEST_PROP(MetamorphicProperties, AWindowReachingEveryEarlierKeyEqualsCausal, ()) {
  CheckHoldsOnCpuModels("window-causal");
}

RC_GTEST_PROP(MetamorphicProperties, PaddingMaskedByDocumentIdsLeavesRealTokensUnchanged, ()) {
  CheckHoldsOnCpuModels("padding");
}

RC_GTEST_PROP(MetamorphicProperties, EveryDeclaredSplitCountAgreesWithTheFirst, ()) {
  CheckHoldsOnModels("splits-agree", {"cpu/flash2-splitkv-bf16"});
}

}  // namespace
}  // namespace attest
