// Capabilities <-> JSON, capability coverage and the kernel registry (see kernel.h).
#include "kernels/kernel.h"

#include <algorithm>
#include <bit>
#include <limits>

#include <nlohmann/json.hpp>

#include "reference/formats/format.h"
#include "reference/names.h"
#include "reference/io/json.h"
#include "reference/recipes/recipe_json.h"

namespace attest {
namespace {

template <class T>
bool Contains(const std::vector<T>& list, const T& value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

struct Flag {
  const char* key;
  bool Capabilities::*member;
};
// The capability flags in protocol order (docs/design.md `describe` reply).
constexpr Flag kFlags[] = {
    {"causal", &Capabilities::causal},       {"window", &Capabilities::window},
    {"softcap", &Capabilities::softcap},     {"alibi", &Capabilities::alibi},
    {"varlen", &Capabilities::varlen},       {"gqa", &Capabilities::gqa},
    {"documents", &Capabilities::documents}, {"prefix_lm", &Capabilities::prefix_lm},
    {"block_sparse", &Capabilities::block_sparse}, {"backward", &Capabilities::backward},
    {"deterministic", &Capabilities::deterministic},
};

// Whether some sequence of `p` has q_len != k_len (where the two causal alignments differ).
bool AnySequenceNonSquare(const Problem& p) {
  if (!p.varlen()) return p.seqlen_q != p.seqlen_k;
  const auto& cq = *p.cu_seqlens_q;
  const auto& ck = *p.cu_seqlens_k;
  for (size_t b = 0; b + 1 < cq.size() && b + 1 < ck.size(); ++b) {
    if (cq[b + 1] - cq[b] != ck[b + 1] - ck[b]) return true;
  }
  return false;
}

// The restriction flags (kernel.h): written only when set, absent means false.
constexpr Flag kRestrictions[] = {
    {"sink", &Capabilities::sink},  // extension flags, written only when claimed
    {"rel_bias", &Capabilities::rel_bias},
    {"paged", &Capabilities::paged},
    {"seqused", &Capabilities::seqused},
    {"same_head_dim_v", &Capabilities::same_head_dim_v},
    {"causal_bottom_right_only", &Capabilities::causal_bottom_right_only},
    {"causal_top_left_only", &Capabilities::causal_top_left_only},
};

}  // namespace

bool Capabilities::Covers(const Problem& p, std::string* why) const {
  auto fail = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  if (!Contains(dtypes, p.dtype)) return fail("dtype " + std::string(Name(p.dtype)));
  if (!Contains(head_dims, p.head_dim)) return fail("head_dim " + std::to_string(p.head_dim));
  if (!Contains(head_dims_v, p.head_dim_v)) {
    return fail("head_dim_v " + std::to_string(p.head_dim_v));
  }
  if (p.causal && !causal) return fail("causal");
  if ((p.window_left >= 0 || p.window_right >= 0) && !window) return fail("window");
  if (p.softcap > 0 && !softcap) return fail("softcap");
  if (p.alibi_slopes && !alibi) return fail("alibi");
  if (p.varlen() && !varlen) return fail("varlen");
  if (p.heads_q != p.heads_kv && !gqa) return fail("gqa");
  if (p.document_ids_q && !documents) return fail("documents");
  if (p.prefix_lm > 0 && !prefix_lm) return fail("prefix_lm");
  if (p.block_sparse && !block_sparse) return fail("block_sparse");
  if (p.sink && !sink) return fail("sink");
  if (p.rel_bias && !rel_bias) return fail("rel_bias");
  if (p.paged() && !paged) return fail("paged");
  if ((p.seqused_q || p.seqused_k) && !seqused) return fail("seqused");
  if (same_head_dim_v && p.head_dim_v != p.head_dim) return fail("head_dim_v != head_dim");
  const bool diagonal = p.causal || p.window_left >= 0 || p.window_right >= 0 ||
                        p.alibi_slopes.has_value();
  if (std::string w = ShapeViolation(shapes, p); !w.empty()) return fail("shape: " + w);
  if (!p.mask_form.empty() &&
      std::find(mask_forms.begin(), mask_forms.end(), p.mask_form) == mask_forms.end()) {
    return fail("mask form " + p.mask_form + (mask_forms.empty() ? " (the API takes no mask tensor)"
                                                                  : ""));
  }
  if (p.num_splits != 0 &&
      std::find(num_splits.begin(), num_splits.end(), p.num_splits) == num_splits.end()) {
    return fail("num_splits " + std::to_string(p.num_splits) +
                (num_splits.empty() ? " (the kernel chooses its own split)" : ""));
  }
  if (causal_bottom_right_only && diagonal && p.causal_align == CausalAlign::kTopLeft &&
      AnySequenceNonSquare(p)) {
    return fail("top-left alignment with q_len != k_len");
  }
  if (causal_top_left_only && diagonal && p.causal_align == CausalAlign::kBottomRight &&
      AnySequenceNonSquare(p)) {
    return fail("bottom-right alignment with q_len != k_len");
  }
  return true;
}

KernelAnswer<ForwardResult> Kernel::ForwardSink(const Problem&, const Tensor&, const Tensor&,
                                                const Tensor&, const Tensor&) {
  return Unsupported{name() + ": no learnable sink"};
}

KernelAnswer<BackwardResult> Kernel::BackwardSink(const Problem&, const Tensor&, const Tensor&,
                                                  const Tensor&, const Tensor&, const Tensor&,
                                                  const Tensor&, const Tensor&) {
  return Unsupported{name() + ": no learnable sink"};
}

KernelAnswer<ForwardResult> Kernel::ForwardRelBias(const Problem&, const Tensor&, const Tensor&,
                                                   const Tensor&, const Tensor&, const Tensor&) {
  return Unsupported{name() + ": no learnable relative bias"};
}

KernelAnswer<BackwardResult> Kernel::BackwardRelBias(const Problem&, const Tensor&,
                                                     const Tensor&, const Tensor&, const Tensor&,
                                                     const Tensor&, const Tensor&, const Tensor&,
                                                     const Tensor&) {
  return Unsupported{name() + ": no learnable relative bias"};
}

double EmptyRowLse(const Capabilities& caps) {
  return caps.empty_row_lse == "+inf" ? std::numeric_limits<double>::infinity()
                                      : -std::numeric_limits<double>::infinity();
}

bool IsOutputPoison(const Tensor& t, int64_t flat) {
  const int size = SizeOf(t.dtype());
  // Element `flat` of the row-major order, through the tensor's strides.
  int64_t offset = 0, rest = flat;
  for (int64_t d = t.rank() - 1; d >= 0; --d) {
    const int64_t n = t.dim(d);
    offset += (rest % n) * t.strides()[static_cast<size_t>(d)];
    rest /= n;
  }
  const std::byte* e = t.bytes() + offset * size;
  for (int b = 0; b < size; ++b) {
    if (static_cast<unsigned char>(e[b]) != kOutputPoisonByte) return false;
  }
  return true;
}

float OutputPoisonF32() { return std::bit_cast<float>(0xFFFFFFFFu); }

nlohmann::json CapabilitiesToJson(const Capabilities& caps) {
  nlohmann::json j;
  j["dtypes"] = nlohmann::json::array();
  for (DType d : caps.dtypes) j["dtypes"].push_back(std::string(Name(d)));
  j["head_dims"] = caps.head_dims;
  j["head_dims_v"] = caps.head_dims_v;
  for (const auto& f : kFlags) j[f.key] = caps.*(f.member);
  j["profile"] = caps.profile;
  if (!caps.recipe.empty()) j["recipe"] = caps.recipe;
  if (caps.empty_row_lse != "-inf") j["empty_row_lse"] = caps.empty_row_lse;
  if (caps.softcap_tanh_abs_error != 0) j["softcap_tanh_abs_error"] = caps.softcap_tanh_abs_error;
  if (caps.device != "host") j["device"] = caps.device;
  for (const auto& f : kRestrictions) {
    if (caps.*(f.member)) j[f.key] = true;
  }
  if (caps.shapes.any()) j["shapes"] = ShapeLimitsToJson(caps.shapes);
  if (caps.strides != "contiguous") j["strides"] = caps.strides;
  if (!caps.mask_forms.empty()) j["mask_forms"] = caps.mask_forms;
  if (!caps.num_splits.empty()) j["num_splits"] = caps.num_splits;
  j["lse"] = caps.lse;
  return j;
}

Expected<Capabilities> CapabilitiesFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Error{"capabilities: not a JSON object"};
  Capabilities caps;
  if (j.contains("dtypes")) {
    if (!j["dtypes"].is_array()) return Error{"capabilities.dtypes: not an array"};
    for (const auto& d : j["dtypes"]) {
      if (!d.is_string()) return Error{"capabilities.dtypes: entries must be strings"};
      auto dt = ParseDType(d.get<std::string>());
      if (!dt) {
        const std::string quoted = QuotedExcerpt(d.get<std::string>());  // never all of it
        return Error{"capabilities.dtypes: unknown dtype '" + quoted.substr(1, quoted.size() - 2) +
                     "'"};
      }
      caps.dtypes.push_back(*dt);
    }
  }
  for (const char* key : {"head_dims", "head_dims_v"}) {
    if (!j.contains(key)) continue;
    const auto& list = j[key];
    auto& out = std::string_view(key) == "head_dims" ? caps.head_dims : caps.head_dims_v;
    if (!list.is_array()) return Error{std::string("capabilities.") + key + ": not an array"};
    for (const auto& v : list) {
      if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
        return Error{std::string("capabilities.") + key + ": entries must be positive integers"};
      }
      out.push_back(v.get<int64_t>());
    }
  }
  for (const auto& f : kFlags) {
    if (!j.contains(f.key)) continue;  // a missing flag means false
    if (!j[f.key].is_boolean()) {
      return Error{std::string("capabilities.") + f.key + ": not a boolean"};
    }
    caps.*(f.member) = j[f.key].get<bool>();
  }
  for (const auto& f : kRestrictions) {
    if (!j.contains(f.key)) continue;
    if (!j[f.key].is_boolean()) {
      return Error{std::string("capabilities.") + f.key + ": not a boolean"};
    }
    caps.*(f.member) = j[f.key].get<bool>();
  }
  if (j.contains("profile")) {
    if (!j["profile"].is_string()) return Error{"capabilities.profile: not a string"};
    caps.profile = j["profile"].get<std::string>();
  }
  if (j.contains("recipe")) {
    // A built-in recipe's name, or the whole recipe as an object (docs/protocol.md "Recipes"),
    // registered so that the checks judge the kernel by it.
    if (j["recipe"].is_object()) {
      auto r = RecipeFromJson(j["recipe"], "capabilities.recipe");
      if (!r.ok()) return r.error();
      auto declared = DeclareRecipe(*r, "capabilities.recipe");
      if (!declared.ok()) return declared.error();
      caps.recipe = std::string((*declared)->name);
    } else if (j["recipe"].is_string()) {
      caps.recipe = j["recipe"].get<std::string>();
    } else {
      return Error{"capabilities.recipe: not a string (a recipe's name) or an object (a recipe)"};
    }
  }
  if (j.contains("empty_row_lse")) {
    const auto& e = j["empty_row_lse"];
    if (!e.is_string() || (e.get<std::string>() != "-inf" && e.get<std::string>() != "+inf")) {
      return Error{"capabilities.empty_row_lse: must be \"-inf\" or \"+inf\" (docs/design.md: "
                   "nothing else is acceptable for an empty row)"};
    }
    caps.empty_row_lse = e.get<std::string>();
  }
  if (j.contains("softcap_tanh_abs_error")) {
    const auto& e = j["softcap_tanh_abs_error"];
    // 0.01 is far above any tanh approximation worth the name (tanh.approx.f32: 8e-6); a
    // larger number is a units mistake, not a declaration.
    if (!e.is_number() || !(e.get<double>() >= 0 && e.get<double>() <= 0.01)) {
      return Error{"capabilities.softcap_tanh_abs_error: must be a number in [0, 0.01] (the "
                   "largest absolute error of the kernel's tanh)"};
    }
    caps.softcap_tanh_abs_error = e.get<double>();
  }
  if (j.contains("device")) {
    const auto& d = j["device"];
    if (!d.is_string() || (d.get<std::string>() != "host" && d.get<std::string>() != "cuda" &&
                           d.get<std::string>() != "hip")) {
      return Error{"capabilities.device: must be \"host\", \"cuda\" or \"hip\" (where the "
                   "kernel's tensors live)"};
    }
    caps.device = d.get<std::string>();
  }
  if (j.contains("mask_forms")) {
    const auto& m = j["mask_forms"];
    if (!m.is_array()) return Error{"capabilities.mask_forms: not an array"};
    for (const auto& f : m) {
      if (!f.is_string() || std::find(std::begin(kMaskForms), std::end(kMaskForms),
                                      f.get<std::string>()) == std::end(kMaskForms)) {
        return Error{"capabilities.mask_forms: entries must be \"bool\", \"additive\" or "
                     "\"additive_f32\""};
      }
      caps.mask_forms.push_back(f.get<std::string>());
    }
  }
  if (j.contains("num_splits")) {
    const auto& m = j["num_splits"];
    if (!m.is_array()) return Error{"capabilities.num_splits: not an array"};
    for (const auto& n : m) {
      if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > kMaxNumSplits ||
          std::find(caps.num_splits.begin(), caps.num_splits.end(), n.get<int64_t>()) !=
              caps.num_splits.end()) {
        return Error{"capabilities.num_splits: entries must be distinct integers in [1, 1024] "
                     "(the split-KV counts the kernel accepts)"};
      }
      caps.num_splits.push_back(n.get<int64_t>());
    }
  }
  if (j.contains("strides")) {
    const auto& s = j["strides"];
    if (!s.is_string() || (s.get<std::string>() != "contiguous" && s.get<std::string>() != "inner" &&
                           s.get<std::string>() != "any")) {
      return Error{"capabilities.strides: must be \"contiguous\", \"inner\" (last dimension "
                   "contiguous) or \"any\" (the input layouts the kernel's interface takes)"};
    }
    caps.strides = s.get<std::string>();
  }
  if (j.contains("shapes")) {
    auto shapes = ShapeLimitsFromJson(j["shapes"]);
    if (!shapes.ok()) return shapes.error();
    caps.shapes = *shapes;
  }
  if (j.contains("lse")) {  // a missing key means true: every kernel returned lse before
    if (!j["lse"].is_boolean()) return Error{"capabilities.lse: not a boolean"};
    caps.lse = j["lse"].get<bool>();
  }
  return caps;
}

KernelRegistry& KernelRegistry::Global() {
  static KernelRegistry registry;
  return registry;
}

void KernelRegistry::Register(std::string name, std::string description, Factory factory) {
  named_[std::move(name)] = Entry{std::move(description), std::move(factory)};
}

void KernelRegistry::RegisterPrefix(std::string prefix, Factory factory) {
  prefixes_[std::move(prefix)] = std::move(factory);
}

std::vector<std::string> KernelRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : named_) names.push_back(name);
  return names;
}

std::string KernelRegistry::Description(const std::string& name) const {
  auto it = named_.find(name);
  return it == named_.end() ? std::string() : it->second.description;
}

Expected<std::unique_ptr<Kernel>> KernelRegistry::Create(std::string_view spec) const {
  if (auto it = named_.find(spec); it != named_.end()) return it->second.factory("");
  for (const auto& [prefix, factory] : prefixes_) {
    if (spec.substr(0, prefix.size()) == prefix) return factory(spec.substr(prefix.size()));
  }
  return Error{"unknown kernel '" + std::string(spec) + "'" + DidYouMean(spec, Names()) +
               " (see `attest list kernels`; external kernels are plugin:PATH or exec:CMD)"};
}

Expected<Tensor> InInputDType(const Tensor& t, DType dtype, std::string_view name) {
  if (t.dtype() == dtype) return t;
  auto out = FromF64(t.dtype() == DType::kF64 ? t : ToF64(t), dtype);
  if (!out) return Error{"input '" + std::string(name) + "': " + out.error().message};
  return out;
}

}  // namespace attest
