// SHA-256 (FIPS 180-4 §6.2) for the golden manifest's file hashes: a small self-contained
// implementation so that attest needs no crypto library for integrity checks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "reference/status.h"

namespace attest {

// Incremental hasher: Update() any number of times, then Final() once.
class Sha256 {
 public:
  Sha256();
  void Update(std::span<const std::byte> data);
  void Update(std::string_view text) {
    Update(std::as_bytes(std::span<const char>(text.data(), text.size())));
  }
  // The 32-byte digest; the hasher must not be used afterwards.
  std::array<uint8_t, 32> Final();

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lower-case hex of a digest (64 characters).
std::string DigestHex(const std::array<uint8_t, 32>& digest);
// Lower-case hex of the digest of `data`.
std::string Sha256Hex(std::span<const std::byte> data);
std::string Sha256Hex(std::string_view text);
// The first 8 bytes of the digest of `text`, big-endian: a seed or a name derived from
// content that is the same under every compiler and standard library (std::hash is not).
uint64_t ContentHash64(std::string_view text);
// Hex digest of a file's bytes; the error names the path.
Expected<std::string> Sha256File(const std::filesystem::path& path);

}  // namespace attest
