// Random mutations of JSON texts, for the fuzz properties of the parsers of untrusted JSON
// (reference/case/case_file_fuzz_test.cc, kernels/exec/reply_fuzz_test.cc): each call
// applies one edit drawn with RapidCheck, aimed at what hostile documents do (repeated keys,
// deep nesting, values of the wrong type or size, edge numbers, broken UTF-8) as well as
// plain corruption (bit flips, truncation, junk). Test code only.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace attest::testing {

// The edits MutateJsonText draws from, one each; an edit that finds nothing to edit leaves t
// as it is.
namespace json_mutations {

// A position in [0, hi].
inline size_t Pos(size_t hi) { return *rc::gen::inRange<size_t>(0, hi + 1); }

// The positions of t's characters for which pred holds, ascending.
template <class Pred>
std::vector<size_t> PositionsOf(const std::string& t, Pred&& pred) {
  std::vector<size_t> out;
  for (size_t p = 0; p < t.size(); ++p) {
    if (pred(t[p])) out.push_back(p);
  }
  return out;
}

// Flips one bit.
inline void FlipBit(std::string& t) {
  if (t.empty()) return;
  t[Pos(t.size() - 1)] ^= static_cast<char>(1u << *rc::gen::inRange(0, 8));
}

// Truncates t at a drawn length.
inline void Truncate(std::string& t) { t.resize(Pos(t.size())); }

// Replaces, deletes or doubles a structural token.
inline void EditToken(std::string& t) {
  const auto tokens =
      PositionsOf(t, [](char c) { return std::strchr("{}[],:\"", c) != nullptr; });
  if (tokens.empty()) return;
  const size_t p = *rc::gen::elementOf(tokens);
  const std::string repl = *rc::gen::elementOf(
      std::vector<std::string>{"", "{", "}", "[", "]", ",", ":", "\"", "\\", " ", "{}", "[]",
                               ",,", "null", std::string(2, t[p])});
  t.replace(p, 1, repl);
}

// Replaces a number by an edge value.
inline void EdgeNumber(std::string& t) {
  std::vector<std::pair<size_t, size_t>> numbers;
  for (size_t p = 0; p < t.size();) {
    if (std::isdigit(static_cast<unsigned char>(t[p])) || t[p] == '-') {
      size_t q = p + 1;
      while (q < t.size() && (std::isdigit(static_cast<unsigned char>(t[q])) ||
                              std::strchr(".eE+-", t[q]) != nullptr)) {
        ++q;
      }
      numbers.push_back({p, q});
      p = q;
    } else {
      ++p;
    }
  }
  if (numbers.empty()) return;
  const auto [b, e] = *rc::gen::elementOf(numbers);
  t.replace(
      b, e - b,
      *rc::gen::elementOf(std::vector<std::string>{"0",
                                                   "1",
                                                   "-1",
                                                   "2",
                                                   "3",
                                                   "64",
                                                   "1.5",
                                                   "-0.0",
                                                   "1e3",
                                                   "1e400",
                                                   "-1e400",
                                                   "2147483647",
                                                   "2147483648",
                                                   "-2147483649",
                                                   "9223372036854775807",
                                                   "9223372036854775808",
                                                   "18446744073709551615",
                                                   "18446744073709551616",
                                                   "1000000",
                                                   std::to_string(*rc::gen::inRange(0, 300))}));
}

// Repeats a key with another value right after an object opens.
inline void RepeatKey(std::string& t) {
  const auto opens = PositionsOf(t, [](char c) { return c == '{'; });
  if (opens.empty()) return;
  const std::string key = *rc::gen::elementOf(std::vector<std::string>{
      "status", "name", "capabilities", "problem", "generator", "seed", "seqlen_q", "causal",
      "dtypes", "window", "inputs", "reason", "message", "route", "params"});
  const std::string value = *rc::gen::elementOf(
      std::vector<std::string>{"1", "true", "\"ok\"", "\"error\"", "null", "[]", "{}"});
  t.insert(*rc::gen::elementOf(opens) + 1, "\"" + key + "\":" + value + ",");
}

// Wraps a value in deep nesting.
inline void DeepNesting(std::string& t) {
  const auto colons = PositionsOf(t, [](char c) { return c == ':' || c == '['; });
  if (colons.empty()) return;
  const size_t p = *rc::gen::elementOf(colons) + 1;
  const size_t depth = *rc::gen::elementOf(std::vector<size_t>{2, 10, 31, 32, 33, 100, 5000});
  t.insert(p, std::string(depth, '['));
  const size_t close = std::min(t.size(), p + depth + Pos(20));
  t.insert(close, std::string(depth, ']'));
}

// Replaces a string's contents.
inline void ReplaceString(std::string& t) {
  const auto quotes = PositionsOf(t, [](char c) { return c == '"'; });
  if (quotes.size() < 2) return;
  const size_t i = *rc::gen::inRange<size_t>(0, quotes.size() - 1);
  const size_t b = quotes[i] + 1, e = quotes[i + 1];
  t.replace(b, e - b,
            *rc::gen::elementOf(std::vector<std::string>{"",
                                                         "x",
                                                         "\\u0000",
                                                         "\\ud800",
                                                         "\xC3\x28",
                                                         "\xED\xA0\x80",
                                                         "\xC0\xAF",
                                                         "\xE2\x82",
                                                         "é",
                                                         "\\\"",
                                                         std::string(3000, 'a'),
                                                         "bf16",
                                                         "f32",
                                                         "ok",
                                                         "unsupported",
                                                         "error",
                                                         "-inf",
                                                         "+inf",
                                                         "top_left",
                                                         "gaussian",
                                                         "../../etc/passwd"}));
}

// Replaces a value by one of another type.
inline void RetypeValue(std::string& t) {
  const auto colons = PositionsOf(t, [](char c) { return c == ':'; });
  if (colons.empty()) return;
  const size_t p = *rc::gen::elementOf(colons) + 1;
  size_t e = p;
  int depth = 0;
  bool in_string = false;
  for (; e < t.size(); ++e) {
    const char c = t[e];
    if (in_string) {
      if (c == '\\')
        ++e;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{')
      ++depth;
    else if ((c == ']' || c == '}') && depth-- == 0)
      break;
    else if (c == ',' && depth == 0)
      break;
  }
  t.replace(p, e - p,
            *rc::gen::elementOf(std::vector<std::string>{"null", "true", "false", "0", "-1",
                                                         "1e400", "\"\"", "\"x\"", "[]", "{}",
                                                         "[1,2]", "{\"a\":1}", "[[[[[]]]]]"}));
}

// Inserts junk bytes.
inline void InsertJunk(std::string& t) {
  const auto junk = *rc::gen::container<std::vector<char>>(rc::gen::arbitrary<char>());
  t.insert(Pos(t.size()), std::string(junk.begin(), junk.end()));
}

// Adds a byte-order mark, a comment or trailing text.
inline void AddBomCommentOrTrailer(std::string& t) {
  const std::string add = *rc::gen::elementOf(
      std::vector<std::string>{"\xEF\xBB\xBF", "/* c */", "// c\n", " x", " {}", "\n"});
  if (*rc::gen::arbitrary<bool>()) {
    t.insert(0, add);
  } else {
    t += add;
  }
}

}  // namespace json_mutations

inline void MutateJsonText(std::string& t) {
  using namespace json_mutations;
  switch (*rc::gen::inRange(0, 10)) {
    case 0: FlipBit(t); break;
    case 1: Truncate(t); break;
    case 2: EditToken(t); break;
    case 3: EdgeNumber(t); break;
    case 4: RepeatKey(t); break;
    case 5: DeepNesting(t); break;
    case 6: ReplaceString(t); break;
    case 7: RetypeValue(t); break;
    case 8: InsertJunk(t); break;
    case 9: AddBomCommentOrTrailer(t); break;
  }
}

}  // namespace attest::testing
