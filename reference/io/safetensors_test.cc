// Tests of the safetensors reader/writer (safetensors.h): round trips of every dtype, the
// reference writer's exact header bytes, strided views, writer errors, the committed
// malformed corpus (testdata/malformed/README.md) and accepted edge cases (testdata/valid).
#include "reference/io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace attest {
namespace {

// AddressSanitizer (GCC's __SANITIZE_ADDRESS__, the asan preset) slows parsing several-fold;
// the time limits are for the Release build.
#ifdef __SANITIZE_ADDRESS__
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

namespace fs = std::filesystem;

const fs::path kTestData = fs::path(ATTEST_SOURCE_DIR) / "reference/io/testdata";

std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::string Text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::vector<std::byte> ReadAll(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return Bytes(s);
}

// A tensor whose bytes are a fixed pseudo-random pattern (every bit pattern is a legal
// element: low-precision floats are raw codes and f32/f64 NaN payloads are kept bitwise).
Tensor Patterned(DType dtype, Shape shape, uint32_t seed) {
  Tensor t = Tensor::Zeros(dtype, std::move(shape));
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.nbytes(); ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t.bytes()[i] = static_cast<std::byte>(x >> 24);
  }
  return t;
}

NamedTensors AllDTypesSample() {
  NamedTensors nt;
  uint32_t seed = 1;
  for (const auto& info : AllDTypes()) {
    nt.Add(std::string(info.name) + "_t", Patterned(info.dtype, {2, 3, 5}, seed++));
  }
  nt.Add("scalar", Patterned(DType::kF64, {}, seed++));
  nt.Add("empty", Tensor::Zeros(DType::kBF16, {4, 0}));
  nt.metadata = {{"format", "pt"}, {"note", "quote \" slash \\ newline \n tab \t é"}};
  return nt;
}

void ExpectSameContents(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    const Tensor* other = b.Find(name);
    ASSERT_NE(other, nullptr) << name;
    EXPECT_TRUE(t.BitwiseEqual(*other))
        << name << " " << t.Describe() << " vs " << other->Describe();
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

TEST(Safetensors, RoundTripsEveryDTypeBitwise) {
  const NamedTensors nt = AllDTypesSample();
  auto bytes = SerializeSafetensors(nt);
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  auto back = ParseSafetensors(*bytes, "memory");
  ASSERT_TRUE(back.ok()) << back.error().message;
  ExpectSameContents(nt, *back);
  // Serializing what was read gives the same bytes (the writer's order is canonical).
  auto again = SerializeSafetensors(*back);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *bytes);
}

TEST(Safetensors, LayoutFollowsTheReferenceWriterOrder) {
  // tensor.rs `prepare`: decreasing position in `enum Dtype`, then name.
  NamedTensors nt;
  nt.Add("u", Tensor::Zeros(DType::kU8, {3}));
  nt.Add("b", Tensor::Zeros(DType::kF32, {1}));
  nt.Add("a", Tensor::Zeros(DType::kF32, {1}));
  nt.Add("h", Tensor::Zeros(DType::kF16, {1}));
  nt.Add("l", Tensor::Zeros(DType::kI64, {1}));
  nt.Add("d", Tensor::Zeros(DType::kF64, {1}));
  nt.Add("e", Tensor::Zeros(DType::kE8M0FNU, {1}));
  nt.Add("m", Tensor::Zeros(DType::kE5M2, {1}));
  nt.Add("n", Tensor::Zeros(DType::kE4M3FN, {1}));
  nt.Add("r", Tensor::Zeros(DType::kBF16, {1}));
  nt.Add("i", Tensor::Zeros(DType::kI32, {1}));
  auto bytes = SerializeSafetensors(nt);
  ASSERT_TRUE(bytes.ok());
  auto header = ParseSafetensorsHeader(*bytes, "memory");
  ASSERT_TRUE(header.ok()) << header.error().message;
  std::vector<std::string> order;
  for (const auto& e : header->entries) order.push_back(e.name);
  EXPECT_EQ(order,
            (std::vector<std::string>{"l", "d", "a", "b", "i", "r", "h", "e", "n", "m", "u"}));
  // Every element is naturally aligned in the file, since the header length is a multiple
  // of 8 and larger elements come first.
  for (const auto& e : header->entries) {
    EXPECT_EQ((header->data_start() + e.begin) % SizeOf(e.dtype), 0u) << e.name;
  }
}

TEST(Safetensors, HeaderBytesMatchTheReferenceWriter) {
  // The header tensor.rs writes for {"test": I32[2, 2]} (its doc example, 60 bytes) padded
  // with spaces to 64, the next multiple of 8.
  NamedTensors nt;
  Tensor t = Tensor::Zeros(DType::kI32, {2, 2});
  for (int i = 0; i < 4; ++i) t.span<int32_t>()[static_cast<size_t>(i)] = i - 1;
  nt.Add("test", t);
  auto bytes = SerializeSafetensors(nt);
  ASSERT_TRUE(bytes.ok());
  const std::string json = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  ASSERT_EQ(json.size(), 60u);
  std::string expected("\x40\0\0\0\0\0\0\0", 8);
  expected += json + "    ";
  for (int32_t v : {-1, 0, 1, 2}) expected.append(reinterpret_cast<const char*>(&v), 4);
  EXPECT_EQ(Text(*bytes), expected);
}

TEST(Safetensors, EmptyFileHasPaddedEmptyObject) {
  auto bytes = SerializeSafetensors(NamedTensors{});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(Text(*bytes), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  auto back = ParseSafetensors(*bytes, "memory");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_TRUE(back->tensors.empty());
}

TEST(Safetensors, SameInputGivesSameBytesWhateverTheInsertionOrder) {
  NamedTensors a = AllDTypesSample();
  NamedTensors b = a;
  std::reverse(b.tensors.begin(), b.tensors.end());
  auto ba = SerializeSafetensors(a);
  auto bb = SerializeSafetensors(b);
  ASSERT_TRUE(ba.ok() && bb.ok());
  EXPECT_EQ(*ba, *bb);
}

TEST(Safetensors, StridedViewsAreWrittenRowMajor) {
  const Tensor base = Patterned(DType::kF32, {3, 4, 5}, 7);
  NamedTensors nt;
  nt.Add("permuted", base.Permute({2, 0, 1}));
  nt.Add("narrowed", base.Narrow(2, 1, 3));
  nt.Add("selected", base.Select(1, 2));
  auto bytes = SerializeSafetensors(nt);
  ASSERT_TRUE(bytes.ok());
  auto back = ParseSafetensors(*bytes, "memory");
  ASSERT_TRUE(back.ok()) << back.error().message;
  for (const auto& [name, t] : nt.tensors) {
    const Tensor* r = back->Find(name);
    ASSERT_NE(r, nullptr);
    EXPECT_TRUE(r->contiguous());
    EXPECT_TRUE(r->BitwiseEqual(t)) << name;  // compares element by element through strides
    EXPECT_TRUE(r->BitwiseEqual(t.Clone())) << name;
  }
}

TEST(Safetensors, WriterRejectsBadInputNamingTheTensor) {
  const auto message = [](const NamedTensors& nt) {
    auto r = SerializeSafetensors(nt);
    return r.ok() ? std::string("(accepted)") : r.error().message;
  };
  NamedTensors dup;
  dup.Add("x", Tensor::Zeros(DType::kF32, {1}));
  dup.Add("x", Tensor::Zeros(DType::kI32, {1}));
  EXPECT_NE(message(dup).find(R"(tensor "x": duplicate name)"), std::string::npos);
  NamedTensors reserved;
  reserved.Add("__metadata__", Tensor::Zeros(DType::kF32, {1}));
  EXPECT_NE(message(reserved).find("reserved"), std::string::npos);
  NamedTensors undefined;
  undefined.Add("u", Tensor());
  EXPECT_NE(message(undefined).find(R"(tensor "u": tensor is undefined)"), std::string::npos);
  NamedTensors bad_name;
  bad_name.Add("a\xff", Tensor::Zeros(DType::kF32, {1}));
  EXPECT_NE(message(bad_name).find("not valid UTF-8"), std::string::npos);
  NamedTensors bad_meta;
  bad_meta.metadata["k"] = "\xc0\x80";
  EXPECT_NE(message(bad_meta).find(R"(__metadata__ entry "k" is not valid UTF-8)"),
            std::string::npos);
}

TEST(Safetensors, FileRoundTripAndFileErrors) {
  const fs::path dir = fs::temp_directory_path() / ("attest_st_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "t.safetensors").string();
  const NamedTensors nt = AllDTypesSample();
  ASSERT_TRUE(WriteSafetensors(path, nt).ok());
  auto back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  ExpectSameContents(nt, *back);
  auto from_memory = ParseSafetensors(ReadAll(path), path);
  ASSERT_TRUE(from_memory.ok());
  ExpectSameContents(*back, *from_memory);
  auto header = ReadSafetensorsHeader(path);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->header_bytes % 8, 0u);
  EXPECT_EQ(header->data_start() + header->data_bytes, fs::file_size(path));

  auto missing = ReadSafetensors((dir / "missing.safetensors").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing.safetensors: cannot open"), std::string::npos);
  auto directory = ReadSafetensors(dir.string());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.error().message.find("a directory"), std::string::npos);
  auto unwritable = WriteSafetensors((dir / "no/such/dir/x.safetensors").string(), nt);
  ASSERT_FALSE(unwritable.ok());
  EXPECT_NE(unwritable.error().message.find("cannot open for writing"), std::string::npos);
  fs::remove_all(dir);
}

// WriteSafetensors writes contiguous tensors from where they are and anything else through
// SerializeSafetensors: the file holds SerializeSafetensors's bytes either way.
TEST(Safetensors, WrittenFilesHoldTheSerializedBytes) {
  const fs::path dir = fs::temp_directory_path() / ("attest_stw_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "t.safetensors").string();
  NamedTensors contiguous = AllDTypesSample();
  contiguous.Add("no_rows", Tensor::Zeros(DType::kF64, {0, 3}));
  contiguous.metadata["k"] = "v";
  NamedTensors strided = contiguous;
  strided.Add("permuted", Patterned(DType::kF32, {3, 4, 5}, 7).Permute({2, 0, 1}));
  for (const NamedTensors* nt : {&contiguous, &strided}) {
    const Status written = WriteSafetensors(path, *nt);
    ASSERT_TRUE(written.ok()) << written.error().message;
    auto bytes = SerializeSafetensors(*nt);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(ReadAll(path), *bytes);
  }
  fs::remove_all(dir);
}

// A header listing 50 000 tensors parses in well under a second: the header JSON is parsed
// in linear time (reference/io/json.h; nlohmann's callback parser took 42 s here).
TEST(Safetensors, AFiftyThousandTensorHeaderParsesInUnderASecond) {
  NamedTensors nt;
  for (int i = 0; i < 50000; ++i) nt.Add("t" + std::to_string(i), Tensor::Zeros(DType::kF32, {1}));
  auto bytes = SerializeSafetensors(nt);
  ASSERT_TRUE(bytes.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto header = ParseSafetensorsHeader(*bytes, "wide.safetensors");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(header.ok()) << header.error().message;
  EXPECT_EQ(header->entries.size(), 50000u);
  std::printf("50000-tensor header (%llu bytes) parsed in %.3f s\n",
              static_cast<unsigned long long>(header->header_bytes), s);
  EXPECT_LT(s, kSanitized ? 10.0 : 1.0);
}

TEST(Safetensors, OnlyRegularFilesAreRead) {
  const fs::path dir = fs::temp_directory_path() / ("attest_st_fifo_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "outputs.safetensors").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = ReadSafetensors(fifo);  // would block forever in open(2) or read(2)
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("a FIFO, not a regular file"), std::string::npos);
  auto h = ReadSafetensorsHeader("/dev/zero");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("a character device"), std::string::npos);
  // A cap below the file's size is refused before anything is allocated.
  const std::string small = (dir / "s.safetensors").string();
  NamedTensors nt;
  nt.Add("x", Tensor::Zeros(DType::kF32, {16}));
  ASSERT_TRUE(WriteSafetensors(small, nt).ok());
  ReadLimits limits;
  limits.max_bytes = 32;
  limits.what = "outputs file";
  auto capped = ReadSafetensors(small, limits);
  ASSERT_FALSE(capped.ok());
  EXPECT_NE(capped.error().message.find("over the 32-byte limit for this outputs file"),
            std::string::npos)
      << capped.error().message;
  fs::remove_all(dir);
}

TEST(Safetensors, EveryTruncationIsRejectedWithoutCrashing) {
  auto bytes = SerializeSafetensors(AllDTypesSample());
  ASSERT_TRUE(bytes.ok());
  for (size_t len = 0; len < bytes->size(); ++len) {
    auto r = ParseSafetensors(std::span(bytes->data(), len), "cut");
    EXPECT_FALSE(r.ok()) << "length " << len;
  }
}

struct MalformedRow {
  std::string file;
  std::string fragment;
};

// Rows of the table in testdata/malformed/README.md: | `file` | defect | `fragment` |.
std::vector<MalformedRow> MalformedTable() {
  std::ifstream f(kTestData / "malformed/README.md");
  std::vector<MalformedRow> rows;
  const std::regex row(R"(^\| `([^`]+)` \| [^|]+ \| `([^`]+)` \|$)");
  std::string line;
  std::smatch m;
  while (std::getline(f, line)) {
    if (std::regex_match(line, m, row)) rows.push_back({m[1], m[2]});
  }
  return rows;
}

TEST(Safetensors, MalformedCorpus) {
  const auto rows = MalformedTable();
  ASSERT_GE(rows.size(), 20u) << "README.md table not found or too short";
  std::set<std::string> listed;
  for (const auto& row : rows) {
    SCOPED_TRACE(row.file);
    listed.insert(row.file);
    const std::string path = (kTestData / "malformed" / row.file).string();
    ASSERT_TRUE(fs::exists(path));
    auto from_file = ReadSafetensors(path);
    ASSERT_FALSE(from_file.ok());
    const std::string& message = from_file.error().message;
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;  // names the file first
    EXPECT_NE(message.find(row.fragment), std::string::npos) << message;
    // The in-memory parser and the header reader say exactly the same.
    auto from_memory = ParseSafetensors(ReadAll(path), path);
    ASSERT_FALSE(from_memory.ok());
    EXPECT_EQ(from_memory.error().message, message);
    auto header = ReadSafetensorsHeader(path);
    ASSERT_FALSE(header.ok());
    EXPECT_EQ(header.error().message, message);
  }
  // Every corpus file has a row (a file without one would test nothing).
  for (const auto& entry : fs::directory_iterator(kTestData / "malformed")) {
    if (entry.path().extension() == ".safetensors") {
      EXPECT_TRUE(listed.count(entry.path().filename().string())) << entry.path();
    }
  }
  std::printf("malformed corpus: %zu files checked\n", rows.size());
}

TEST(Safetensors, ValidEdgeCasesAreAccepted) {
  const auto read = [](const char* name) {
    auto r = ReadSafetensors((kTestData / "valid" / name).string());
    EXPECT_TRUE(r.ok()) << name << ": " << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(r).value() : NamedTensors{};
  };
  {
    const NamedTensors nt = read("unordered_keys.safetensors");
    ASSERT_EQ(nt.tensors.size(), 2u);
    EXPECT_EQ(nt.tensors[0].first, "a");  // file (offset) order, not JSON order
    EXPECT_EQ(nt.Find("a")->span<float>()[0], 1.0f);
    EXPECT_EQ(nt.Find("b")->span<float>()[0], 2.0f);
  }
  {
    const NamedTensors nt = read("empty_tensors.safetensors");
    ASSERT_EQ(nt.tensors.size(), 3u);
    EXPECT_EQ(nt.Find("z")->shape(), (Shape{0, 3}));
    EXPECT_EQ(nt.Find("a")->span<uint8_t>()[1], 9);
    EXPECT_EQ(nt.Find("e")->rank(), 0);
    EXPECT_EQ(nt.Find("e")->span<int64_t>()[0], -5);
  }
  {
    const NamedTensors nt = read("metadata_only.safetensors");
    EXPECT_TRUE(nt.tensors.empty());
    EXPECT_EQ(nt.metadata, (std::map<std::string, std::string>{{"format", "np"}, {"x", ""}}));
  }
  {
    const NamedTensors nt = read("unicode_names.safetensors");
    ASSERT_NE(nt.Find("q\u00e9"), nullptr);
    EXPECT_EQ(nt.Find("q\u00e9")->dtype(), DType::kBF16);
    EXPECT_EQ(nt.Find("q\u00e9")->span<uint16_t>()[0], 0x3f80);
    ASSERT_NE(nt.Find("\u03bb\n"), nullptr);
    EXPECT_EQ(nt.Find("\u03bb\n")->dtype(), DType::kE4M3FN);
    EXPECT_EQ(nt.Find("\u03bb\n")->span<uint8_t>()[1], 0xb8);
  }
}

// Scalar UTF-8 check written from the bit-level definition (RFC 3629 §3): lead byte gives the
// length, continuation bytes are 10xxxxxx, and the code point must need that length, not be
// a surrogate and not exceed U+10FFFF. IsValidUtf8 uses the byte-range table instead.
bool ReferenceUtf8(const std::vector<unsigned char>& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned b = s[i];
    size_t len;
    uint32_t cp;
    if (b < 0x80) {
      len = 1;
      cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4;
      cp = b & 0x07;
    } else
      return false;
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += len;
  }
  return true;
}

TEST(Utf8, AgreesWithBitLevelDefinitionOnEveryShortSequence) {
  // Every 1-, 2- and 3-byte string, and 4-byte strings with every first two bytes and the
  // boundary classes of the last two: about 17 M strings.
  int64_t checked = 0, valid = 0, mismatches = 0;
  std::string first_mismatch;
  std::vector<unsigned char> s;
  const auto check = [&] {
    const std::string_view text(reinterpret_cast<const char*>(s.data()), s.size());
    const bool got = IsValidUtf8(text);
    if (got != ReferenceUtf8(s) && mismatches++ == 0) {
      for (unsigned char c : s) first_mismatch += std::to_string(c) + " ";
    }
    ++checked;
    valid += got;
  };
  for (int len = 1; len <= 3; ++len) {
    for (uint32_t x = 0; x < (1u << (8 * len)); ++x) {
      s.resize(static_cast<size_t>(len));
      for (int k = 0; k < len; ++k)
        s[static_cast<size_t>(k)] = static_cast<unsigned char>(x >> (8 * k));
      check();
    }
  }
  for (uint32_t x = 0; x < (1u << 16); ++x) {
    for (unsigned char c : {0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xFF}) {
      for (unsigned char d : {0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xFF}) {
        s = {static_cast<unsigned char>(x >> 8), static_cast<unsigned char>(x), c, d};
        check();
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch: " << first_mismatch;
  // Offsets of the first bad sequence.
  size_t bad = 99;
  EXPECT_FALSE(IsValidUtf8("ab\xe2\x82", &bad));
  EXPECT_EQ(bad, 2u);
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));   // U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // U+110000
  std::printf("utf8: %lld strings checked, %lld valid\n", static_cast<long long>(checked),
              static_cast<long long>(valid));
}

}  // namespace
}  // namespace attest
