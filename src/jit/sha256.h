// SHA-256 (FIPS 180-4), used for JIT cache keys and cache-entry checksums. Private to src/jit;
// tests reach it through the project-root include path.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flare::jit {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view text) { update(text.data(), text.size()); }
  // Hashes a length prefix before the text, so concatenated fields cannot alias
  // ("ab" + "c" differs from "a" + "bc").
  void update_field(std::string_view text);
  Digest finish();  // the object must not be updated afterwards

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string to_hex(const Sha256::Digest& digest);
// Hex SHA-256 of `text`.
std::string sha256_hex(std::string_view text);

}  // namespace flare::jit
