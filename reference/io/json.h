// Strict parsing of JSON that attest did not write (case files, exec worker replies and
// describe answers, plugin frames, fuzz reports, manifests, safetensors headers): RFC 8259
// JSON only (no comments, no byte-order mark: RFC 8259 §8.1), every object's keys distinct
// (§4 leaves duplicates to the implementation; nlohmann::json would keep the last one
// silently, so `"seqlen_q": 4, "seqlen_q": 8` would mean 8), and containers nested no deeper
// than a limit, so that no later recursive walk (a destructor, a dump into a message) can
// exhaust the stack. The DOM is built by a SAX handler (nlohmann::json::sax_parse, whose
// parser keeps its own explicit stack), in time linear in the text: nlohmann's callback
// parser rescans an object for discarded members after each nested object ends, which made
// a 50 000-tensor safetensors header take 42 s.
//
// Messages never quote a whole untrusted document: JsonExcerpt writes at most a bounded
// number of characters of a value, whatever its size or depth.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "reference/status.h"

namespace attest {

// Deep enough for every document attest reads (a case file nests four levels: case,
// problem, document_ids_q, one batch's list); far from what would strain a stack.
inline constexpr int kJsonDefaultMaxDepth = 32;

// Why a text was refused, with what the caller needs to word its own message.
struct JsonDefect {
  enum class Kind {
    kSyntax,         // not JSON (detail: the parser's explanation)
    kNumberRange,    // a number literal beyond double's range (1e400)
    kByteOrderMark,  // starts with EF BB BF
    kDuplicateKey,   // key: the repeated key; parent: the key of the object holding it
    kTooDeep,        // parent: the key under which the limit was crossed
  };
  Kind kind = Kind::kSyntax;
  size_t byte = 0;        // 0-based offset in the text where the defect was seen
  std::string key;        // kDuplicateKey
  std::string parent;     // kDuplicateKey, kTooDeep ("" at the top level)
  bool top_level = true;  // kDuplicateKey: the repeated key belongs to the root object
  int max_depth = 0;      // kTooDeep
  std::string detail;     // kSyntax, kNumberRange

  // "duplicate key "seqlen_q" inside "problem"", "invalid JSON at byte 12: syntax error ...",
  // "containers nested deeper than 32 levels (under key "a")".
  std::string Describe() const;
};

// Parses `text` as one JSON value with distinct keys and at most `max_depth` nested
// containers (a scalar at the top is depth 0, `{}` depth 1).
std::variant<nlohmann::json, JsonDefect> ParseJsonText(std::string_view text,
                                                       int max_depth = kJsonDefaultMaxDepth);

// ParseJsonText with the defect as an Error "<source>: <Describe()>".
Expected<nlohmann::json> ParseJson(std::string_view text, std::string_view source,
                                   int max_depth = kJsonDefaultMaxDepth);

// At most about `max_chars` characters of `value` as compact JSON, "..." marking what was left
// out (deeper levels included), for messages about untrusted documents.
std::string JsonExcerpt(const nlohmann::json& value, size_t max_chars = 120);

// A JSON string literal of `text` cut to `max_chars` bytes (on a UTF-8 boundary), for naming a
// key or a value in a message.
std::string QuotedExcerpt(std::string_view text, size_t max_chars = 80);

}  // namespace attest
