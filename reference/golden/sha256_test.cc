// SHA-256 against the FIPS 180-4 example vectors (NIST CSRC "SHA256.pdf", "SHA2_Additional").
#include "reference/golden/sha256.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

namespace attest {
namespace {

TEST(Sha256, NistOneBlockAndTwoBlockMessages) {
  EXPECT_EQ(Sha256Hex(std::string_view("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex(std::string_view("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(std::string_view(
                "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// Seeds and file names derived from content: SHA-256("abc") begins ba7816bf 8f01cfea (FIPS
// 180-4 example), on every compiler and standard library.
TEST(Sha256, ContentHash64IsTheDigestsFirstEightBytes) {
  EXPECT_EQ(ContentHash64("abc"), 0xba7816bf8f01cfeaULL);
  EXPECT_EQ(ContentHash64(""), 0xe3b0c44298fc1c14ULL);
}

TEST(Sha256, MillionAsFedInUnevenChunks) {
  // NIST: one million 'a'. Fed in chunks of 1..127 bytes to exercise the buffering paths.
  Sha256 hasher;
  const std::string block(127, 'a');
  size_t left = 1'000'000, step = 1;
  while (left > 0) {
    const size_t n = std::min(left, step);
    hasher.Update(std::string_view(block.data(), n));
    left -= n;
    step = step % 127 + 1;
  }
  EXPECT_EQ(DigestHex(hasher.Final()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
  // 55, 56 and 64 bytes: the length field fits, just misses, and a full block precedes it.
  // Expected digests from Python's hashlib (sha256(b"a" * n)).
  EXPECT_EQ(Sha256Hex(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(Sha256Hex(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(Sha256Hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

}  // namespace
}  // namespace attest
