// Payload: a chunk's bytes as the store is handed them — one span, or the pieces a network
// message arrived in (a Store stream's receive buffers). Either way the store copies them
// once, straight into their RAM slot or SSD slot buffer, hashing each block while the copy
// has it in cache, so a chunk that came in pieces is never first gathered into a buffer of
// its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace kvc::storage {

class Payload {
 public:
  Payload() = default;
  // Bytes in one piece are a payload: a span, a vector, anything a span of const bytes is
  // made from (viewed, not copied: they must outlive this Payload).
  Payload(std::span<const uint8_t> bytes)  // NOLINT(google-explicit-constructor)
      : pieces_{bytes}, size_(bytes.size()) {}
  template <typename Bytes>
  requires std::is_convertible_v<const Bytes&, std::span<const uint8_t>> Payload(
      const Bytes& bytes)  // NOLINT(google-explicit-constructor)
      : Payload(std::span<const uint8_t>(bytes)) {}
  // The concatenation of `pieces`, which must outlive this Payload.
  explicit Payload(std::span<const std::span<const uint8_t>> pieces);

  size_t size() const { return size_; }
  std::span<const std::span<const uint8_t>> pieces() const {
    return {pieces_.data(), pieces_.size()};
  }
  // The bytes, if they are one piece (or none).
  std::optional<std::span<const uint8_t>> contiguous() const;
  // Copies the bytes to dst (size() of them).
  void CopyTo(uint8_t* dst) const;
  // The same, returning PayloadChecksum (slot_format.h) of the bytes written: each block
  // (16 KiB, well inside L1 + L2) hashed from dst right after it is copied, so the hash
  // neither reads memory a second time nor sees bytes other than those stored.
  uint64_t CopyWithChecksum(uint8_t* dst) const;

 private:
  absl::InlinedVector<std::span<const uint8_t>, 1> pieces_;
  size_t size_ = 0;
};

}  // namespace kvc::storage
