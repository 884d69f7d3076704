// Suggestions for mistyped names (see names.h).
#include "reference/names.h"

#include <algorithm>
#include <vector>

namespace attest {

int EditDistance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  // d[i][j]: distance between the first i characters of a and the first j of b.
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string DidYouMean(std::string_view word, std::span<const std::string> names) {
  if (word.empty() || names.empty()) return {};
  // 1. A name that is the word after a prefix ("cpu/", "mutant/").
  for (const std::string& name : names) {
    if (name.size() > word.size() && name.ends_with(word) &&
        name[name.size() - word.size() - 1] == '/') {
      return " (did you mean '" + name + "'?)";
    }
  }
  // 2. The nearest name, if near enough (ties: the first in the list).
  const int allowed = std::max<int>(1, static_cast<int>(word.size()) / 3);
  const std::string* best = nullptr;
  int best_distance = allowed + 1;
  for (const std::string& name : names) {
    const int dist = EditDistance(word, name);
    if (dist < best_distance) {
      best_distance = dist;
      best = &name;
    }
  }
  return best != nullptr ? " (did you mean '" + *best + "'?)" : std::string();
}

}  // namespace attest
