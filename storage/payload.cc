#include "storage/payload.h"

#include <algorithm>
#include <cstring>

#include "storage/xxh3.h"

namespace kvc::storage {

Payload::Payload(std::span<const std::span<const uint8_t>> pieces) {
  for (std::span<const uint8_t> p : pieces) {
    if (p.empty()) continue;
    pieces_.push_back(p);
    size_ += p.size();
  }
}

std::optional<std::span<const uint8_t>> Payload::contiguous() const {
  if (pieces_.empty()) return std::span<const uint8_t>();
  if (pieces_.size() == 1) return pieces_[0];
  return std::nullopt;
}

void Payload::CopyTo(uint8_t* dst) const {
  for (std::span<const uint8_t> p : pieces_) {
    std::memcpy(dst, p.data(), p.size());
    dst += p.size();
  }
}

uint64_t Payload::CopyWithChecksum(uint8_t* dst) const {
  constexpr size_t kBlock = 16 << 10;
  Xxh3Stream state;
  for (std::span<const uint8_t> p : pieces_) {
    for (size_t at = 0; at < p.size(); at += kBlock) {
      const size_t n = std::min(kBlock, p.size() - at);
      std::memcpy(dst, p.data() + at, n);
      state.Update(dst, n);
      dst += n;
    }
  }
  return state.Digest();
}

}  // namespace kvc::storage
