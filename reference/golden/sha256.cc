// SHA-256 per FIPS 180-4: §4.2.2 constants, §5.1.1 padding, §6.2.2 compression.
#include "reference/golden/sha256.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/io/files.h"

namespace attest {
namespace {

// §4.2.2: first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

constexpr uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }


}  // namespace

Sha256::Sha256()
    // §5.3.3: first 32 bits of the fractional parts of the square roots of the first 8 primes.
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
         0x5be0cd19} {}

void Sha256::Compress(const uint8_t* block) {
  std::array<uint32_t, 64> w;
  for (int t = 0; t < 16; ++t) {  // big-endian message words
    w[t] = (uint32_t{block[4 * t]} << 24) | (uint32_t{block[4 * t + 1]} << 16) |
           (uint32_t{block[4 * t + 2]} << 8) | uint32_t{block[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = Rotr(w[t - 15], 7) ^ Rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = Rotr(w[t - 2], 17) ^ Rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
           h = h_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kK[t] + w[t];
    const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::Update(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t n = data.size();
  total_bytes_ += n;
  if (buffered_ > 0) {
    const size_t take = std::min(n, 64 - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < 64) return;
    Compress(buffer_.data());
    buffered_ = 0;
  }
  for (; n >= 64; p += 64, n -= 64) Compress(p);
  std::memcpy(buffer_.data(), p, n);
  buffered_ = n;
}

std::array<uint8_t, 32> Sha256::Final() {
  // §5.1.1: a 1 bit, zeros to 56 mod 64 bytes, then the message length in bits (big-endian).
  const uint64_t bits = total_bytes_ * 8;
  std::array<uint8_t, 72> pad{};
  pad[0] = 0x80;
  const size_t zeros = (buffered_ < 56) ? 56 - buffered_ : 120 - buffered_;
  for (int i = 0; i < 8; ++i) pad[zeros + static_cast<size_t>(i)] = uint8_t(bits >> (56 - 8 * i));
  Update(std::as_bytes(std::span<const uint8_t>(pad.data(), zeros + 8)));
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) out[4 * i + j] = uint8_t(h_[i] >> (24 - 8 * j));
  }
  return out;
}

std::string DigestHex(const std::array<uint8_t, 32>& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(64);
  for (uint8_t byte : digest) {
    hex.push_back(kHex[byte >> 4]);
    hex.push_back(kHex[byte & 15]);
  }
  return hex;
}

std::string Sha256Hex(std::span<const std::byte> data) {
  Sha256 hasher;
  hasher.Update(data);
  return DigestHex(hasher.Final());
}

std::string Sha256Hex(std::string_view text) {
  return Sha256Hex(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

uint64_t ContentHash64(std::string_view text) {
  Sha256 h;
  h.Update(text);
  const auto d = h.Final();
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x = (x << 8) | d[static_cast<size_t>(i)];
  return x;
}

Expected<std::string> Sha256File(const std::filesystem::path& path) {
  ReadLimits limits;
  limits.max_bytes = std::numeric_limits<uint64_t>::max();  // streamed in chunks
  limits.what = "file to hash";
  auto f = OpenRegularFile(path.string(), limits);
  if (!f) return f.error();
  Sha256 hasher;
  std::vector<std::byte> chunk(1 << 16);
  for (uint64_t left = f->size(); left > 0;) {
    const auto got = static_cast<size_t>(std::min<uint64_t>(left, chunk.size()));
    if (Status s = f->Read(chunk.data(), got); !s) return s.error();
    hasher.Update(std::span<const std::byte>(chunk.data(), got));
    left -= got;
  }
  return DigestHex(hasher.Final());
}

}  // namespace attest
