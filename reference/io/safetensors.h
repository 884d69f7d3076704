// Reader and writer for safetensors files (huggingface/safetensors README "Format" and
// safetensors/src/tensor.rs): an 8-byte little-endian u64 N, N bytes of UTF-8 JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}},
// then the data buffer, which the tensors must cover exactly (offsets are relative to its
// start). Data is little-endian and row-major. The reader rejects every malformed file with an
// Error naming the file, the defect and the tensor; it never allocates more than the file's
// size for tensor data (the JSON header costs memory proportional to its length, which is
// capped at 100 MB as in tensor.rs `MAX_HEADER_SIZE`). The writer follows tensor.rs
// `prepare`: tensors ordered by decreasing dtype alignment then name, header padded with
// spaces to a multiple of 8, so that its bytes equal the reference writer's for the same input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reference/dtype.h"
#include "reference/io/files.h"
#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

// tensor.rs `MAX_HEADER_SIZE`: headers longer than this are rejected before being read.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Named tensors and string metadata: what a safetensors file holds. The reader returns the
// tensors in file (data offset) order, each an owning contiguous tensor.
struct NamedTensors {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor called `name`, or nullptr.
  const Tensor* Find(std::string_view name) const;
  // Appends a tensor (no check for duplicates: the writer reports those).
  void Add(std::string name, Tensor tensor) {
    tensors.emplace_back(std::move(name), std::move(tensor));
  }
};

// One header entry, as laid out in the file: [begin, end) relative to the data buffer.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A validated header: entries sorted by data offset, covering the data buffer exactly.
struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N, the JSON length (including padding)
  uint64_t data_bytes = 0;    // file size - 8 - N
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;

  // Offset of the data buffer in the file.
  uint64_t data_start() const { return 8 + header_bytes; }
};

// Parses and validates the header of a whole file held in memory (the data bytes are not
// read, but their extent is checked against the header). `source_name` names the file in
// messages.
Expected<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> bytes,
                                                   std::string_view source_name);
// Reads and validates only the header of the file at `path` (plus its size).
Expected<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// Parses a whole file held in memory; tensors are copied into owning storage.
Expected<NamedTensors> ParseSafetensors(std::span<const std::byte> bytes,
                                        std::string_view source_name);
// Reads the file at `path`: the header first, then each tensor straight into its storage.
// The file must be a regular file no larger than the memory budget (reference/problem/
// budget.h); the overload takes other limits (a kernel's outputs: their expected size, no
// symlink, the call's deadline).
Expected<NamedTensors> ReadSafetensors(const std::string& path);
Expected<NamedTensors> ReadSafetensors(const std::string& path, const ReadLimits& limits);

// The file's bytes. Fails (naming the tensor) on duplicate or reserved names, undefined
// tensors and names or metadata that are not valid UTF-8. Strided views are written as their
// row-major contiguous copies. The same input gives the same bytes.
Expected<std::vector<std::byte>> SerializeSafetensors(const NamedTensors& tensors);
// Serializes and writes `path` whole or not at all (files.h WriteFileAtomic), reporting I/O
// failures with the path.
Status WriteSafetensors(const std::string& path, const NamedTensors& tensors);

// Whether `text` is well-formed UTF-8 (Unicode 15 §3.9 table 3-7: no overlong forms, no
// surrogates, nothing past U+10FFFF). On failure, `*bad_offset` receives the offset of the
// first byte of the first ill-formed sequence.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

}  // namespace attest
