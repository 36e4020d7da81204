// Byte-level tokens, the tokenizer of the models trained in train/ (kvtrain/tokenizer.py):
// ids 0, 1, 2 are the config's bos, eos and pad; byte b is id 3 + b. Every text has a
// tokenization and nothing needs a vocabulary file. tests/engine/spec/byte_tokens_vectors.json
// (written by the Python tokenizer) pins both languages to the same ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

inline constexpr uint32_t kFirstByteToken = 3;
inline constexpr uint32_t kByteTokens = 256;

// Whether a vocabulary holds every byte token.
inline bool HoldsByteTokens(int64_t vocab_size) {
  return vocab_size >= static_cast<int64_t>(kFirstByteToken + kByteTokens);
}

inline std::vector<uint32_t> EncodeBytes(std::string_view text) {
  std::vector<uint32_t> ids;
  ids.reserve(text.size());
  for (unsigned char b : text) ids.push_back(kFirstByteToken + b);
  return ids;
}

// The bytes of the byte tokens among `ids` (specials and other ids are skipped).
inline std::string DecodeBytes(const std::vector<uint32_t>& ids) {
  std::string out;
  for (uint32_t t : ids) {
    if (t >= kFirstByteToken && t < kFirstByteToken + kByteTokens) {
      out.push_back(static_cast<char>(t - kFirstByteToken));
    }
  }
  return out;
}

}  // namespace kvc
