// Suggestions for mistyped names: "did you mean" for the kernels, suites, checks, recipes,
// profiles and options a user spells on the command line or in Python. A suggestion is the
// nearest name by edit distance (optimal string alignment: insertions, deletions,
// substitutions and transpositions of neighbours each cost 1), offered only when it is close
// enough to be the intended one (at most a third of the word's length, and at least 1), or a
// name of which the word is the part after a prefix ("flash2-bf16" for "cpu/flash2-bf16").
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace attest {

// The edit distance between a and b (optimal string alignment).
int EditDistance(std::string_view a, std::string_view b);

// " (did you mean 'X'?)" for the name nearest `word`, or "" when none is close.
std::string DidYouMean(std::string_view word, std::span<const std::string> names);

}  // namespace attest
