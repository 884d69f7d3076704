// Strict JSON parsing and bounded excerpts (see json.h).
#include "reference/io/json.h"

#include <fmt/format.h>

#include <utility>
#include <vector>

namespace attest {
namespace {

using Json = nlohmann::json;

// Builds the DOM from SAX events (the interface of nlohmann::json::sax_parse, json_sax.hpp),
// refusing a repeated key or one container too many as soon as it is seen, before the rest
// of a hostile text is read.
class StrictDomBuilder {
 public:
  explicit StrictDomBuilder(int max_depth) : max_depth_(max_depth) {}

  bool null() { return Put(nullptr) != nullptr; }
  bool boolean(bool b) { return Put(b) != nullptr; }
  bool number_integer(Json::number_integer_t v) { return Put(v) != nullptr; }
  bool number_unsigned(Json::number_unsigned_t v) { return Put(v) != nullptr; }
  bool number_float(Json::number_float_t v, const Json::string_t& /*text*/) {
    return Put(v) != nullptr;
  }
  bool string(Json::string_t& s) { return Put(std::move(s)) != nullptr; }
  bool binary(Json::binary_t& b) { return Put(Json::binary(std::move(b))) != nullptr; }

  bool start_object(std::size_t /*size*/) { return Open(Json::object()); }
  bool start_array(std::size_t /*size*/) { return Open(Json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(Json::string_t& k) {
    Frame& f = stack_.back();
    if (f.value->contains(k)) {
      defect_.kind = JsonDefect::Kind::kDuplicateKey;
      defect_.key = k;
      defect_.parent = f.name;
      defect_.top_level = stack_.size() == 1;
      return false;
    }
    last_key_ = k;
    f.pending = &(*f.value)[std::move(k)];
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    // nlohmann reports a float literal beyond double's range as out_of_range 406.
    defect_.kind = ex.id == 406 ? JsonDefect::Kind::kNumberRange : JsonDefect::Kind::kSyntax;
    defect_.byte = position > 0 ? position - 1 : 0;
    std::string what = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
    if (const auto at = what.find("syntax error"); at != std::string::npos) {
      what = what.substr(at);
    } else if (const auto close = what.find("] "); close != std::string::npos) {
      what = what.substr(close + 2);
    }
    // The explanation quotes the last token read, which may be a megabyte-long string.
    constexpr size_t kMaxDetail = 200;
    if (what.size() > kMaxDetail) {
      size_t end = kMaxDetail;
      while (end > 0 && (static_cast<unsigned char>(what[end]) & 0xC0) == 0x80) --end;
      what = what.substr(0, end) + "...";
    }
    defect_.detail = std::move(what);
    return false;
  }

  Json& root() { return root_; }
  const JsonDefect& defect() const { return defect_; }

 private:
  struct Frame {
    Json* value;              // the open container
    Json* pending = nullptr;  // objects: the member the next value fills
    std::string name;         // the key this container sits under ("" at the top level)
  };

  // Stores a value where the innermost open container expects it; returns where it went.
  template <class V>
  Json* Put(V&& v) {
    if (stack_.empty()) {
      root_ = Json(std::forward<V>(v));
      return &root_;
    }
    Frame& f = stack_.back();
    if (f.value->is_array()) {
      f.value->push_back(Json(std::forward<V>(v)));
      return &f.value->back();
    }
    *f.pending = Json(std::forward<V>(v));
    return f.pending;
  }

  bool Open(Json empty) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      defect_.kind = JsonDefect::Kind::kTooDeep;
      defect_.parent = last_key_;
      defect_.max_depth = max_depth_;
      return false;
    }
    std::string name = stack_.empty()                    ? std::string()
                       : stack_.back().value->is_array() ? stack_.back().name
                                                         : last_key_;
    Json* slot = Put(std::move(empty));
    // The parent array does not grow while this child is open, so the pointer stays valid.
    stack_.push_back({slot, nullptr, std::move(name)});
    return true;
  }

  bool Close() {
    stack_.pop_back();
    return true;
  }

  int max_depth_;
  Json root_;
  std::vector<Frame> stack_;
  std::string last_key_;
  JsonDefect defect_;
};

// Appends at most `budget` characters of `v` to `out`; false once the budget ran out.
bool AppendExcerpt(const Json& v, size_t budget, int depth, std::string& out) {
  auto room = [&] { return out.size() < budget; };
  auto put = [&](std::string_view s) {
    if (out.size() + s.size() > budget) {
      out.append(s.substr(0, budget > out.size() ? budget - out.size() : 0));
      return false;
    }
    out.append(s);
    return true;
  };
  // Every container nested this deep is elided: the excerpt's own recursion is bounded
  // whatever built the value.
  constexpr int kMaxExcerptDepth = 8;
  if (v.is_object() || v.is_array()) {
    const bool object = v.is_object();
    if (v.empty()) return put(object ? "{}" : "[]");
    if (depth >= kMaxExcerptDepth) return put(object ? "{...}" : "[...]");
    if (!put(object ? "{" : "[")) return false;
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first && !put(",")) return false;
      first = false;
      if (object && !(put(QuotedExcerpt(it.key(), 40)) && put(":"))) return false;
      if (!AppendExcerpt(*it, budget, depth + 1, out)) return false;
      if (!room()) return false;
    }
    return put(object ? "}" : "]");
  }
  if (v.is_string()) return put(QuotedExcerpt(v.get_ref<const std::string&>(), budget));
  return put(v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

}  // namespace

std::string JsonDefect::Describe() const {
  switch (kind) {
    case Kind::kSyntax:
      return fmt::format("invalid JSON at byte {}: {}", byte, detail);
    case Kind::kNumberRange:
      return fmt::format("invalid JSON at byte {}: number out of range ({})", byte, detail);
    case Kind::kByteOrderMark:
      return "invalid JSON: starts with a byte-order mark";
    case Kind::kDuplicateKey:
      return top_level ? fmt::format("duplicate key {} at the top level", QuotedExcerpt(key))
                       : fmt::format("duplicate key {} inside {}", QuotedExcerpt(key),
                                     QuotedExcerpt(parent));
    case Kind::kTooDeep:
      return parent.empty() ? fmt::format("containers nested deeper than {} levels", max_depth)
                            : fmt::format("containers nested deeper than {} levels (under key {})",
                                          max_depth, QuotedExcerpt(parent));
  }
  return "invalid JSON";
}

std::variant<Json, JsonDefect> ParseJsonText(std::string_view text, int max_depth) {
  // RFC 8259 §8.1: "Implementations MUST NOT add a byte order mark"; nlohmann would skip one.
  if (text.starts_with("\xEF\xBB\xBF")) {
    JsonDefect d;
    d.kind = JsonDefect::Kind::kByteOrderMark;
    return d;
  }
  StrictDomBuilder builder(max_depth);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder, Json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) return builder.defect();
  return std::move(builder.root());
}

Expected<Json> ParseJson(std::string_view text, std::string_view source, int max_depth) {
  auto parsed = ParseJsonText(text, max_depth);
  if (auto* d = std::get_if<JsonDefect>(&parsed)) {
    return Error{fmt::format("{}: {}", source, d->Describe())};
  }
  return std::get<Json>(std::move(parsed));
}

std::string JsonExcerpt(const Json& value, size_t max_chars) {
  std::string out;
  if (!AppendExcerpt(value, max_chars, 0, out)) out += "...";
  return out;
}

std::string QuotedExcerpt(std::string_view text, size_t max_chars) {
  bool cut = false;
  if (text.size() > max_chars) {
    size_t end = max_chars;
    // Back up to the start of a UTF-8 sequence (continuation bytes are 10xxxxxx).
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    text = text.substr(0, end);
    cut = true;
  }
  std::string quoted = Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (cut) quoted.insert(quoted.size() - 1, "...");
  return quoted;
}

}  // namespace attest
