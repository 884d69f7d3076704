// Fuzz property of the safetensors reader (safetensors.h): valid files from the writer, with
// random mutations (bit flips, truncation at every length class, header-length edits, JSON
// token and number edits, inserted and appended garbage), must parse to a value or an Error,
// never crash, leak or read out of bounds (the asan preset runs this test too). Whatever the
// reader accepts must survive a write/read round trip unchanged. Bounded by RC_PARAMS
// (max_success, set by ctest) so that it stays fast; reproduce a failure with the
// RC_PARAMS="reproduce=..." line RapidCheck prints.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "reference/io/safetensors.h"

namespace attest {
namespace {

constexpr std::string_view kSource = "fuzz.safetensors";

// Names exercising escapes, non-ASCII and the metadata key's neighbourhood.
const std::vector<std::string> kNames = {
    "q",  "k",  "v",    "do", "o", "lse",        "a.b",           "",         " ",         "\"",
    "\\", "\n", "\x01", "é",  "λ", "__metadata", "__metadata__x", "x\u2028y", "\U0001F600"};

NamedTensors GenNamedTensors() {
  NamedTensors nt;
  const auto count = *rc::gen::inRange(0, 5);
  std::vector<std::string> used;
  for (int i = 0; i < count; ++i) {
    std::string name = *rc::gen::elementOf(kNames);
    if (std::find(used.begin(), used.end(), name) != used.end()) name += std::to_string(i);
    used.push_back(name);
    const auto dtype = static_cast<DType>(*rc::gen::inRange(0, int(AllDTypes().size())));
    const auto rank = *rc::gen::inRange(0, 4);
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(*rc::gen::inRange<int64_t>(0, 4));
    Tensor t = Tensor::Zeros(dtype, shape);
    const auto bytes = *rc::gen::container<std::vector<uint8_t>>(static_cast<size_t>(t.nbytes()),
                                                                 rc::gen::arbitrary<uint8_t>());
    if (!bytes.empty()) std::memcpy(t.bytes(), bytes.data(), bytes.size());
    nt.Add(name, std::move(t));
  }
  const auto meta = *rc::gen::inRange(0, 3);
  for (int i = 0; i < meta; ++i) {
    nt.metadata[*rc::gen::elementOf(kNames) + "m"] = *rc::gen::elementOf(kNames);
  }
  return nt;
}

std::vector<std::byte> Serialize(const NamedTensors& nt) {
  auto bytes = SerializeSafetensors(nt);
  RC_ASSERT(bytes.ok());
  return std::move(bytes).value();
}

uint64_t HeaderLength(const std::vector<std::byte>& f) {
  uint64_t n = 0;
  for (int i = 0; i < 8 && i < static_cast<int>(f.size()); ++i) {
    n |= static_cast<uint64_t>(f[static_cast<size_t>(i)]) << (8 * i);
  }
  return n;
}

void SetHeaderLength(std::vector<std::byte>& f, uint64_t n) {
  if (f.size() < 8) f.resize(8);
  for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
}

// Positions [begin, end) of the header text, clamped to the file.
std::pair<size_t, size_t> HeaderRange(const std::vector<std::byte>& f) {
  const size_t end = static_cast<size_t>(std::min<uint64_t>(8 + HeaderLength(f), f.size()));
  return {std::min<size_t>(8, f.size()), end};
}

std::vector<std::byte> ToBytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// One random mutation of `f`. The header is where most defects can hide, so most mutations
// aim at it; the length prefix and the data buffer get their own.
void Mutate(std::vector<std::byte>& f) {
  const auto [hb, he] = HeaderRange(f);
  const auto pos_in = [&](size_t lo, size_t hi) {  // a position in [lo, hi], hi inclusive
    return *rc::gen::inRange<size_t>(lo, hi + 1);
  };
  switch (*rc::gen::inRange(0, 8)) {
    case 0: {  // flip one bit, anywhere
      if (f.empty()) return;
      const size_t p = pos_in(0, f.size() - 1);
      f[p] ^= static_cast<std::byte>(1u << *rc::gen::inRange(0, 8));
      break;
    }
    case 1: {  // truncate, by length class: inside the prefix, inside the header, at its
               // end, inside the data, one byte short
      const size_t n = f.size();
      const size_t cls = *rc::gen::inRange(0, 5);
      const size_t len = cls == 0   ? pos_in(0, std::min<size_t>(n, 8))
                         : cls == 1 ? pos_in(hb, he)
                         : cls == 2 ? he
                         : cls == 3 ? pos_in(he, n)
                                    : (n ? n - 1 : 0);
      f.resize(std::min(len, n));
      break;
    }
    case 2: {  // edit the header length
      const uint64_t n = HeaderLength(f);
      const uint64_t size = f.size();
      const std::vector<uint64_t> choices = {0,
                                             1,
                                             n - 1,
                                             n + 1,
                                             n + 8,
                                             size - 8,
                                             size - 7,
                                             size,
                                             kSafetensorsMaxHeaderBytes,
                                             kSafetensorsMaxHeaderBytes + 1,
                                             1ull << 63,
                                             ~0ull,
                                             *rc::gen::arbitrary<uint64_t>()};
      SetHeaderLength(f, *rc::gen::elementOf(choices));
      break;
    }
    case 3: {  // replace, delete or duplicate a JSON structural token
      std::vector<size_t> tokens;
      for (size_t p = hb; p < he; ++p) {
        const char c = static_cast<char>(f[p]);
        if (std::strchr("{}[],:\"", c) != nullptr) tokens.push_back(p);
      }
      if (tokens.empty()) return;
      const size_t p = *rc::gen::elementOf(tokens);
      const std::string repl = *rc::gen::elementOf(std::vector<std::string>{
          "", "{", "}", "[", "]", ",", ":", "\"", "\\", " ", "{}", "[]", ",,", "null", "0"});
      const std::string twice = std::string(1, static_cast<char>(f[p])) + static_cast<char>(f[p]);
      const auto bytes = ToBytes(*rc::gen::elementOf(std::vector<std::string>{repl, twice}));
      f.erase(f.begin() + static_cast<std::ptrdiff_t>(p));
      f.insert(f.begin() + static_cast<std::ptrdiff_t>(p), bytes.begin(), bytes.end());
      break;
    }
    case 4: {  // replace a number in the header (a dimension or an offset)
      std::vector<std::pair<size_t, size_t>> numbers;
      for (size_t p = hb; p < he;) {
        if (std::isdigit(static_cast<unsigned char>(f[p]))) {
          size_t q = p;
          while (q < he && std::isdigit(static_cast<unsigned char>(f[q]))) ++q;
          numbers.push_back({p, q});
          p = q;
        } else {
          ++p;
        }
      }
      if (numbers.empty()) return;
      const auto [b, e] = *rc::gen::elementOf(numbers);
      const std::string repl = *rc::gen::elementOf(std::vector<std::string>{
          "0", "1", "2", "7", "8", "-1", "1.5", "1e3", "4294967296", "9223372036854775807",
          "9223372036854775808", "18446744073709551615", "18446744073709551616",
          std::to_string(*rc::gen::inRange(0, 300))});
      const auto bytes = ToBytes(repl);
      f.erase(f.begin() + static_cast<std::ptrdiff_t>(b),
              f.begin() + static_cast<std::ptrdiff_t>(e));
      f.insert(f.begin() + static_cast<std::ptrdiff_t>(b), bytes.begin(), bytes.end());
      break;
    }
    case 5: {  // insert random bytes inside the header (length prefix unchanged)
      const auto junk = *rc::gen::container<std::vector<uint8_t>>(rc::gen::arbitrary<uint8_t>());
      const size_t p = pos_in(hb, he);
      std::vector<std::byte> bytes(junk.size());
      if (!junk.empty()) std::memcpy(bytes.data(), junk.data(), junk.size());
      f.insert(f.begin() + static_cast<std::ptrdiff_t>(p), bytes.begin(), bytes.end());
      break;
    }
    case 6: {  // append garbage after the data
      const auto junk = *rc::gen::container<std::vector<uint8_t>>(rc::gen::arbitrary<uint8_t>());
      for (uint8_t b : junk) f.push_back(static_cast<std::byte>(b));
      break;
    }
    case 7: {  // grow or shrink the header while fixing up the length prefix
      if (*rc::gen::arbitrary<bool>()) {
        const size_t k = *rc::gen::inRange<size_t>(1, 9);
        f.insert(f.begin() + static_cast<std::ptrdiff_t>(he), k, std::byte{' '});
        SetHeaderLength(f, HeaderLength(f) + k);
      } else if (he > hb) {
        f.erase(f.begin() + static_cast<std::ptrdiff_t>(he) - 1);
        SetHeaderLength(f, HeaderLength(f) - 1);
      }
      break;
    }
  }
}

RC_GTEST_PROP(SafetensorsFuzz, TheReaderReadsBackWhatTheWriterWrote, ()) {
  const NamedTensors nt = GenNamedTensors();
  const auto bytes = Serialize(nt);
  auto back = ParseSafetensors(bytes, kSource);
  RC_ASSERT(back.ok());
  RC_ASSERT(back->tensors.size() == nt.tensors.size());
  for (const auto& [name, t] : nt.tensors) {
    const Tensor* r = back->Find(name);
    RC_ASSERT(r != nullptr);
    RC_ASSERT(r->BitwiseEqual(t));
  }
  RC_ASSERT(back->metadata == nt.metadata);
  RC_ASSERT(Serialize(*back) == bytes);
}

RC_GTEST_PROP(SafetensorsFuzz, AMutatedFileGivesAValueOrAnErrorNeverACrash, ()) {
  auto f = Serialize(GenNamedTensors());
  const auto mutations = *rc::gen::inRange(1, 5);
  for (int i = 0; i < mutations; ++i) Mutate(f);
  auto r = ParseSafetensors(f, kSource);
  if (!r.ok()) {
    // Every message names the file first and says something after it.
    const std::string& m = r.error().message;
    RC_ASSERT(m.rfind(std::string(kSource) + ": ", 0) == 0);
    RC_ASSERT(m.size() > kSource.size() + 2);
    RC_TAG("rejected");
    return;
  }
  RC_TAG("accepted");
  // Accepted: tensor data covers the data buffer exactly, and a write/read round trip
  // reproduces every tensor and the metadata.
  auto header = ParseSafetensorsHeader(f, kSource);
  RC_ASSERT(header.ok());
  uint64_t total = 0;
  for (const auto& [name, t] : r->tensors) total += static_cast<uint64_t>(t.nbytes());
  RC_ASSERT(total == header->data_bytes);
  RC_ASSERT(header->data_start() + header->data_bytes == f.size());
  const auto rewritten = Serialize(*r);
  auto again = ParseSafetensors(rewritten, kSource);
  RC_ASSERT(again.ok());
  RC_ASSERT(again->tensors.size() == r->tensors.size());
  for (const auto& [name, t] : r->tensors) {
    const Tensor* other = again->Find(name);
    RC_ASSERT(other != nullptr);
    RC_ASSERT(other->BitwiseEqual(t));
  }
  RC_ASSERT(again->metadata == r->metadata);
}

}  // namespace
}  // namespace attest
