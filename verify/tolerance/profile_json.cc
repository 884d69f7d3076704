// The profiles as `attest list profiles` and the reports show them (see tolerance.h): each
// policy's rule and parameters as JSON, and a profile's one-line summary.
#include "verify/tolerance/tolerance.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace attest {

nlohmann::json PolicyToJson(const Policy& p) {
  nlohmann::json j = {{"kind", Name(p.kind)}, {"rule", p.Describe()}};
  if (p.format) j["format"] = Name(*p.format);
  if (p.format && p.format_scale != 1.0) j["format_scale"] = p.format_scale;
  switch (p.kind) {
    case PolicyKind::kBaselineRatio:
      j["ratio"] = p.ratio;
      j["floor_ulps"] = p.floor_ulps;
      j["floor_scale"] = Name(p.floor_scale);
      if (p.rounding_floor) j["rounding_floor"] = true;
      if (p.floor_scale == FloorScale::kTerms) j["term_ulps"] = p.term_ulps;
      break;
    case PolicyKind::kAbsRel:
      j["atol"] = p.atol;
      j["rtol"] = p.rtol;
      j["atol_relative_to_max"] = p.atol_relative_to_max;
      break;
    case PolicyKind::kUlpBudget:
      j["ulps"] = p.ulps;
      break;
    case PolicyKind::kCosineFloor:
      j["min_cosine"] = p.min_cosine;
      j["per_row"] = p.per_row;
      break;
    case PolicyKind::kFormatBound:
      j["floor_ulps"] = p.floor_ulps;
      j["floor_scale"] = Name(p.floor_scale);
      if (p.floor_scale == FloorScale::kTerms) j["term_ulps"] = p.term_ulps;
      break;
  }
  return j;
}

nlohmann::json ProfileToJson(const Profile& p) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const TensorPolicies& t : p.tensors) {
    nlohmann::json list = nlohmann::json::array();
    for (const Policy& pol : t.policies) list.push_back(PolicyToJson(pol));
    tensors[t.tensor] = list;
  }
  return {{"name", p.name},
          {"description", p.description},
          {"evidence", p.evidence},
          {"summary", Summary(p)},
          {"tensors", tensors}};
}

std::string Summary(const Profile& p) {
  // Tensors with identical policy lists share one entry ("dq dk dv: ...").
  std::vector<std::pair<std::string, std::string>> groups;
  for (const TensorPolicies& t : p.tensors) {
    std::string rules;
    for (const Policy& pol : t.policies) rules += (rules.empty() ? "" : ", ") + pol.Describe();
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.second == rules; });
    if (it != groups.end()) {
      it->first += " " + t.tensor;
    } else {
      groups.emplace_back(t.tensor, rules);
    }
  }
  std::string out;
  for (const auto& [names, rules] : groups) {
    out += (out.empty() ? "" : "; ") + names + ": " + rules;
  }
  return out;
}

nlohmann::json ProfilesToJson() {
  nlohmann::json out = nlohmann::json::array();
  for (const Profile& p : AllProfiles()) {
    nlohmann::json j = ProfileToJson(p);
    j["description"] = p.description + " -- " + Summary(p);
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace attest
