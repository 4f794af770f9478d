// SHA-256 against the FIPS 180-4 / NIST example vectors, and the length-prefixed field hashing
// that keeps cache-key inputs from aliasing.
#include <gtest/gtest.h>

#include <string>

#include "src/jit/sha256.h"

namespace flare::jit {
namespace {

TEST(Sha256, NistVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalUpdatesMatchOneShotAcrossBlockBoundaries) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + (i * 7) % 26));
  for (size_t chunk : {1, 7, 55, 56, 63, 64, 65, 97}) {
    Sha256 hash;
    for (size_t at = 0; at < text.size(); at += chunk) hash.update(text.substr(at, chunk));
    EXPECT_EQ(to_hex(hash.finish()), sha256_hex(text)) << "chunk " << chunk;
  }
}

TEST(Sha256, FieldsDoNotAliasAcrossSplits) {
  Sha256 first, second;
  first.update_field("ab");
  first.update_field("c");
  second.update_field("a");
  second.update_field("bc");
  EXPECT_NE(to_hex(first.finish()), to_hex(second.finish()));
}

}  // namespace
}  // namespace flare::jit
