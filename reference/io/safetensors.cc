// safetensors reader and writer (see safetensors.h; rules from huggingface/safetensors
// safetensors/src/tensor.rs `read_metadata`, `Metadata::validate` and `prepare`).
#include "reference/io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "reference/io/files.h"
#include "reference/io/json.h"
#include "reference/problem/budget.h"

namespace attest {

// Tensor bytes are copied as they lie in memory; safetensors data is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using Json = nlohmann::json;

constexpr uint64_t kLengthBytes = 8;  // tensor.rs `N_LEN`

// Every dtype of tensor.rs `enum Dtype`, in declaration order. The writer sorts tensors by
// descending position here ("sorting by descending dtype alignment, then by name"); the
// reader reports a dtype listed here that attest does not hold as unsupported rather than
// unknown, so that the message says which side is lacking.
constexpr std::array<std::string_view, 22> kReferenceDTypes = {
    "BOOL",    "F4",          "F6_E2M3",     "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",     "U16", "F16", "BF16",    "I32",
    "U32",     "F32",         "C64",         "F64",     "I64", "U64"};

int ReferenceDTypeRank(DType dtype) {
  const auto it =
      std::find(kReferenceDTypes.begin(), kReferenceDTypes.end(), Info(dtype).safetensors);
  assert(it != kReferenceDTypes.end());
  return static_cast<int>(it - kReferenceDTypes.begin());
}

// JSON string literal with serde_json's escaping (which tensor.rs uses to write headers):
// '"', '\\', \b \f \n \r \t, other control characters as \u00xx in lower-case hex, all
// other bytes (including non-ASCII UTF-8) verbatim.
std::string JsonString(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += kHex[u >> 4];
          out += kHex[u & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// Error builders: every message starts with the file, then the tensor when there is one.
Error FileError(std::string_view source, std::string_view what) {
  return Error{fmt::format("{}: {}", source, what)};
}
Error TensorError(std::string_view source, std::string_view name, std::string_view what) {
  return Error{fmt::format("{}: tensor {}: {}", source, JsonString(name), what)};
}

uint64_t LoadLittleEndianU64(std::span<const std::byte> bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) {
    v |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  }
  return v;
}

// Step 1 of reading (tensor.rs `read_metadata`): the length prefix against the file size.
// Returns N, the header length.
Expected<uint64_t> CheckLengthPrefix(std::span<const std::byte> first_bytes, uint64_t file_size,
                                     std::string_view source) {
  if (file_size < kLengthBytes) {
    return FileError(source, fmt::format("file is {} bytes, shorter than the 8-byte header "
                                         "length prefix",
                                         file_size));
  }
  const uint64_t n = LoadLittleEndianU64(first_bytes);
  if (n > kSafetensorsMaxHeaderBytes) {
    return FileError(source, fmt::format("header length {} exceeds the {}-byte limit", n,
                                         kSafetensorsMaxHeaderBytes));
  }
  if (n > file_size - kLengthBytes) {
    return FileError(source, fmt::format("header length {} runs past the end of the file "
                                         "({} bytes)",
                                         n, file_size));
  }
  return n;
}

// A safetensors header nests at most three containers deep (header object, entry object,
// shape or data_offsets list); anything deeper is malformed, and refusing it at once bounds
// the parser's stack to the header's legitimate shape.
constexpr int kMaxContainerDepth = 3;

// Parses the header text (reference/io/json.h: duplicate keys at any level refused, since a
// JSON DOM would keep one of them silently; no container deeper than a header can hold).
Expected<Json> ParseHeaderJson(std::string_view text, std::string_view source) {
  // UTF-8 first, as tensor.rs does (`from_utf8` before `serde_json::from_str`), so that the
  // message is about the encoding rather than a JSON token.
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return FileError(
        source, fmt::format("invalid UTF-8 in header at byte {} of the file", kLengthBytes + bad));
  }
  auto parsed = ParseJsonText(text, kMaxContainerDepth);
  const auto* d = std::get_if<JsonDefect>(&parsed);
  if (d == nullptr) return std::get<Json>(std::move(parsed));
  using Kind = JsonDefect::Kind;
  switch (d->kind) {
    case Kind::kByteOrderMark:
      // serde_json (and RFC 8259 §8.1 for JSON texts exchanged between systems) does not
      // accept one.
      return FileError(source, "invalid JSON in header: starts with a byte-order mark");
    case Kind::kDuplicateKey:
      return FileError(source, d->top_level
                                   ? fmt::format("duplicate key {} in header", JsonString(d->key))
                                   : fmt::format("duplicate key {} inside {}", JsonString(d->key),
                                                 JsonString(d->parent)));
    case Kind::kTooDeep:
      return FileError(source, fmt::format("header nests containers deeper than a safetensors "
                                           "header can (under key {})",
                                           JsonString(d->parent)));
    case Kind::kNumberRange:
      // serde_json calls a float literal beyond double's range (1e400) a JSON error; so do we.
      return FileError(source,
                       fmt::format("invalid JSON in header: number out of range ({})", d->detail));
    case Kind::kSyntax:
      break;
  }
  return FileError(source, fmt::format("invalid JSON in header (byte {} of the file): {}",
                                       kLengthBytes + d->byte, d->detail));
}

bool IsUnsignedInteger(const Json& j) { return j.is_number_unsigned(); }

// One tensor entry: exactly the fields dtype, shape, data_offsets, each well-typed, with a
// byte extent that matches the element count. (tensor.rs ignores unknown fields; we reject
// them, since a field we do not understand may change what the data means.)
Expected<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value,
                                      std::string_view source) {
  if (!value.is_object()) return TensorError(source, name, "entry is not a JSON object");
  for (const auto& [field, unused] : value.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return TensorError(source, name, fmt::format("unexpected field {}", JsonString(field)));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) {
      return TensorError(source, name, fmt::format("missing field \"{}\"", field));
    }
  }
  SafetensorsEntry entry;
  entry.name = name;

  // dtype
  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) return TensorError(source, name, "dtype is not a string");
  const auto& dtype_name = dtype.get_ref<const std::string&>();
  if (auto d = DTypeFromSafetensors(dtype_name)) {
    entry.dtype = *d;
  } else if (std::find(kReferenceDTypes.begin(), kReferenceDTypes.end(), dtype_name) !=
             kReferenceDTypes.end()) {
    return TensorError(
        source, name,
        fmt::format("safetensors dtype {} is not supported by attest", JsonString(dtype_name)));
  } else {
    return TensorError(source, name, fmt::format("unknown dtype {}", JsonString(dtype_name)));
  }

  // shape: non-negative integers whose product, in bytes, fits an int64 (Tensor's extent
  // type; tensor.rs likewise refuses products that overflow its usize).
  const Json& shape = value["shape"];
  const bool shape_ok =
      shape.is_array() && std::all_of(shape.begin(), shape.end(), IsUnsignedInteger);
  if (!shape_ok) {
    return TensorError(source, name, "shape is not a list of non-negative integers");
  }
  constexpr uint64_t kMaxExtent = std::numeric_limits<int64_t>::max();
  uint64_t numel = 1;
  bool overflow = false;
  entry.shape.reserve(shape.size());
  for (const Json& dim : shape) {
    const auto d = dim.get<uint64_t>();
    overflow = overflow || d > kMaxExtent || __builtin_mul_overflow(numel, d, &numel);
    entry.shape.push_back(static_cast<int64_t>(std::min(d, kMaxExtent)));
  }
  const auto size = static_cast<uint64_t>(SizeOf(entry.dtype));
  uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, size, &nbytes) || nbytes > kMaxExtent;
  if (overflow) {
    return TensorError(
        source, name,
        fmt::format("element count of shape {} overflows 64 bits", JsonExcerpt(shape, 200)));
  }

  // data_offsets
  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return TensorError(source, name, "data_offsets is not a list of two non-negative integers");
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    return TensorError(
        source, name,
        fmt::format("data_offsets [{}, {}] have begin > end", entry.begin, entry.end));
  }
  if (entry.end - entry.begin != nbytes) {
    return TensorError(source, name,
                       fmt::format("data_offsets [{}, {}] span {} bytes but {}[{}] needs {}",
                                   entry.begin, entry.end, entry.end - entry.begin,
                                   Name(entry.dtype), fmt::join(entry.shape, ", "), nbytes));
  }
  return entry;
}

// Step 2 of reading: the header JSON against the data buffer of `data_bytes` bytes.
Expected<SafetensorsHeader> ParseHeaderText(std::string_view text, uint64_t data_bytes,
                                            std::string_view source) {
  auto parsed = ParseHeaderJson(text, source);
  if (!parsed.ok()) return parsed.error();
  const Json& root = *parsed;
  if (!root.is_object()) return FileError(source, "header is not a JSON object");

  SafetensorsHeader header;
  header.header_bytes = text.size();
  header.data_bytes = data_bytes;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return FileError(source, "__metadata__ is not a JSON object of strings");
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return FileError(source, fmt::format("__metadata__ value for key {} is not a string",
                                               JsonString(mkey)));
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    auto entry = ParseEntry(key, value, source);
    if (!entry.ok()) return entry.error();
    header.entries.push_back(std::move(entry).value());
  }

  // Layout (tensor.rs sorts entries by data_offsets, then requires each to start where the
  // previous one ended and the last to end at the end of the file). Ties between empty
  // tensors at one offset are broken by name so that the order is deterministic.
  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto& e : header.entries) {
    if (e.begin < covered) {
      return TensorError(
          source, e.name,
          fmt::format("data_offsets [{}, {}] overlap tensor {} [{}, {}]", e.begin, e.end,
                      JsonString(previous->name), previous->begin, previous->end));
    }
    if (e.begin > covered) {
      const std::string after = previous ? fmt::format("after tensor {} ending at {}",
                                                       JsonString(previous->name), previous->end)
                                         : std::string("at the start of the data buffer");
      return TensorError(source, e.name,
                         fmt::format("data_offsets [{}, {}] leave a hole of {} bytes {} "
                                     "(tensors must cover the data buffer exactly)",
                                     e.begin, e.end, e.begin - covered, after));
    }
    if (e.end > data_bytes) {
      return TensorError(source, e.name,
                         fmt::format("data_offsets [{}, {}] run past the end of the {}-byte "
                                     "data buffer",
                                     e.begin, e.end, data_bytes));
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_bytes) {
    return FileError(source, fmt::format("data buffer has {} bytes but the tensors cover only "
                                         "{} (trailing bytes)",
                                         data_bytes, covered));
  }
  return header;
}

// Tensor::Zeros of the entry's dtype and shape: the destination of its bytes.
Tensor AllocateFor(const SafetensorsEntry& e) { return Tensor::Zeros(e.dtype, e.shape); }

}  // namespace

const Tensor* NamedTensors::Find(std::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  // Unicode §3.9 table 3-7, "Well-Formed UTF-8 Byte Sequences": the allowed range of the
  // second byte depends on the first (E0: A0..BF, ED: 80..9F, F0: 90..BF, F4: 80..8F).
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (b < 0x80) {
      len = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char c = s[i + k];
      ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    }
    if (!ok) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

Expected<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> bytes,
                                                   std::string_view source_name) {
  auto n = CheckLengthPrefix(bytes, bytes.size(), source_name);
  if (!n.ok()) return n.error();
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + kLengthBytes, *n);
  return ParseHeaderText(text, bytes.size() - kLengthBytes - *n, source_name);
}

Expected<NamedTensors> ParseSafetensors(std::span<const std::byte> bytes,
                                        std::string_view source_name) {
  auto header = ParseSafetensorsHeader(bytes, source_name);
  if (!header.ok()) return header.error();
  NamedTensors out;
  out.metadata = std::move(header->metadata);
  out.tensors.reserve(header->entries.size());
  const std::byte* data = bytes.data() + header->data_start();
  for (const auto& e : header->entries) {
    Tensor t = AllocateFor(e);
    if (e.end > e.begin) std::memcpy(t.bytes(), data + e.begin, e.end - e.begin);
    out.Add(e.name, std::move(t));
  }
  return out;
}

namespace {

// Reads the length prefix and the header of an open file (positioned at its start).
Expected<SafetensorsHeader> ReadHeader(RegularFile& f, const std::string& path) {
  std::array<std::byte, kLengthBytes> prefix{};
  if (f.size() >= kLengthBytes) {
    if (auto s = f.Read(prefix.data(), kLengthBytes); !s.ok()) return s.error();
  }
  auto n = CheckLengthPrefix(prefix, f.size(), path);
  if (!n.ok()) return n.error();
  std::string text(*n, '\0');  // N <= min(file size - 8, 100 MB), checked above
  if (auto s = f.Read(text.data(), *n); !s.ok()) return s.error();
  return ParseHeaderText(text, f.size() - kLengthBytes - *n, path);
}

}  // namespace

Expected<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  // Only the header is read, so the file's size is not capped; it must still be a file.
  ReadLimits limits;
  limits.max_bytes = std::numeric_limits<uint64_t>::max();
  limits.what = "safetensors file";
  auto f = OpenRegularFile(path, limits);
  if (!f.ok()) return f.error();
  return ReadHeader(*f, path);
}

Expected<NamedTensors> ReadSafetensors(const std::string& path) {
  auto budget = MemoryBudgetBytes();
  if (!budget) return budget.error();
  ReadLimits limits;
  limits.max_bytes = *budget;
  limits.what = "safetensors file";
  return ReadSafetensors(path, limits);
}

Expected<NamedTensors> ReadSafetensors(const std::string& path, const ReadLimits& limits) {
  auto f = OpenRegularFile(path, limits);
  if (!f.ok()) return f.error();
  auto header = ReadHeader(*f, path);
  if (!header.ok()) return header.error();
  // The entries are sorted and cover the buffer exactly, so the data is read in one pass;
  // their total is the file's size, which the limits capped before anything was allocated.
  NamedTensors out;
  out.metadata = std::move(header->metadata);
  out.tensors.reserve(header->entries.size());
  for (const auto& e : header->entries) {
    Tensor t = AllocateFor(e);
    if (auto s = f->Read(t.bytes(), e.end - e.begin); !s.ok()) return s.error();
    out.Add(e.name, std::move(t));
  }
  return out;
}

namespace {

// A file's length prefix and header, and its tensors in the order of their bytes.
struct FileLayout {
  std::vector<std::byte> head;
  std::vector<const std::pair<std::string, Tensor>*> order;
  uint64_t data_bytes = 0;
};

Expected<FileLayout> LayoutOf(const NamedTensors& tensors) {
  constexpr std::string_view kWhere = "SerializeSafetensors";
  // 1. Check names, tensors and metadata.
  std::set<std::string_view> names;
  for (const auto& [name, t] : tensors.tensors) {
    if (name == "__metadata__") {
      return TensorError(kWhere, name, "the name is reserved for the metadata");
    }
    if (!IsValidUtf8(name)) return TensorError(kWhere, name, "name is not valid UTF-8");
    if (!names.insert(name).second) return TensorError(kWhere, name, "duplicate name");
    if (!t.defined()) return TensorError(kWhere, name, "tensor is undefined");
  }
  for (const auto& [key, value] : tensors.metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return FileError(kWhere,
                       fmt::format("__metadata__ entry {} is not valid UTF-8", JsonString(key)));
    }
  }

  // 2. Order as tensor.rs `prepare`: decreasing dtype rank (so larger elements come first and
  //    stay aligned), then by name (bytewise, as Rust's String ordering).
  std::vector<const std::pair<std::string, Tensor>*> order;
  order.reserve(tensors.tensors.size());
  for (const auto& item : tensors.tensors) order.push_back(&item);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const int ra = ReferenceDTypeRank(a->second.dtype());
    const int rb = ReferenceDTypeRank(b->second.dtype());
    if (ra != rb) return ra > rb;
    return a->first < b->first;
  });

  // 3. Header JSON, compact, in serde_json's spelling: metadata first, then the entries in
  //    layout order; padded with spaces to a multiple of 8 bytes.
  std::string header = "{";
  if (!tensors.metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : tensors.metadata) {
      if (!first) header += ',';
      first = false;
      header += JsonString(key) + ':' + JsonString(value);
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    const auto nbytes = static_cast<uint64_t>(t.nbytes());
    if (header.size() > 1) header += ',';
    header += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          JsonString(item->first), Info(t.dtype()).safetensors,
                          fmt::join(t.shape(), ","), offset, offset + nbytes);
    offset += nbytes;
  }
  header += '}';
  header.resize((header.size() + kLengthBytes - 1) / kLengthBytes * kLengthBytes, ' ');
  if (header.size() > kSafetensorsMaxHeaderBytes) {
    return FileError(kWhere, fmt::format("header of {} bytes exceeds the {}-byte limit",
                                         header.size(), kSafetensorsMaxHeaderBytes));
  }

  // 4. Length prefix and header.
  FileLayout layout;
  layout.head.resize(kLengthBytes + header.size());
  const uint64_t n = header.size();
  for (size_t i = 0; i < kLengthBytes; ++i) layout.head[i] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(layout.head.data() + kLengthBytes, header.data(), header.size());
  layout.order = std::move(order);
  layout.data_bytes = offset;
  return layout;
}

}  // namespace

Expected<std::vector<std::byte>> SerializeSafetensors(const NamedTensors& tensors) {
  auto layout = LayoutOf(tensors);
  if (!layout.ok()) return layout.error();
  // The header, then each tensor's bytes in row-major order.
  std::vector<std::byte> out(layout->head.size() + layout->data_bytes);
  std::memcpy(out.data(), layout->head.data(), layout->head.size());
  std::byte* dst = out.data() + layout->head.size();
  for (const auto* item : layout->order) {
    const Tensor& t = item->second;
    if (t.numel() == 0) continue;
    const int64_t size = SizeOf(t.dtype());
    if (t.contiguous()) {
      std::memcpy(dst, t.bytes(), static_cast<size_t>(t.nbytes()));
      dst += t.nbytes();
    } else {
      ForEachIndex(t.shape(), [&](std::span<const int64_t> idx) {
        std::memcpy(dst, t.bytes() + t.Offset(idx) * size, static_cast<size_t>(size));
        dst += size;
      });
    }
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const NamedTensors& tensors) {
  auto layout = LayoutOf(tensors);
  if (!layout.ok()) return Error{path + ": " + layout.error().message};
  // Contiguous tensors go to the file from where they are (SerializeSafetensors's bytes
  // without the copy into one buffer); any other layout through SerializeSafetensors.
  std::vector<std::span<const std::byte>> parts = {layout->head};
  for (const auto* item : layout->order) {
    const Tensor& t = item->second;
    if (t.numel() == 0) continue;
    if (!t.contiguous()) {
      auto bytes = SerializeSafetensors(tensors);
      if (!bytes.ok()) return Error{path + ": " + bytes.error().message};
      return WriteFileAtomic(path, *bytes);
    }
    parts.emplace_back(t.bytes(), static_cast<size_t>(t.nbytes()));
  }
  return WriteFileAtomic(path, parts);
}

}  // namespace attest
