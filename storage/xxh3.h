// XXH3-64, the payload checksum (PayloadChecksum, slot_format.h), at the widest vector unit
// this CPU has. Debian's libxxhash is built for SSE2 only: 17 GB/s here, so checking a
// 227,840-byte chunk took 13 µs — a quarter of an SSD fetch's CPU at 4 GB/s. The same
// function built for AVX2 runs at ~48 GB/s and for AVX-512 at ~78 (same digests: XXH3's
// output does not depend on the vector unit). Each variant is its own translation unit
// (xxh3_avx2.cc, xxh3_avx512.cc, compiled for that unit); the first call picks the widest
// the CPU supports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kvc::storage {

// One build of XXH3-64: one-shot, and streaming over a state of state_bytes (64-aligned).
struct Xxh3Impl {
  std::string_view name;  // "sse2", "avx2", "avx512"
  uint64_t (*hash)(const void* data, size_t bytes);
  size_t state_bytes;
  void (*reset)(void* state);
  void (*update)(void* state, const void* data, size_t bytes);
  uint64_t (*digest)(const void* state);
};

// The builds this CPU can run, narrowest first (tests compare them).
std::span<const Xxh3Impl* const> SupportedXxh3Impls();
// The widest of them (or the one KVCACHE_XXH3 names), chosen once.
const Xxh3Impl& Xxh3();

inline uint64_t Xxh3Hash(const void* data, size_t bytes) { return Xxh3().hash(data, bytes); }

// Streaming XXH3-64 with the chosen build.
class Xxh3Stream {
 public:
  Xxh3Stream() : impl_(&Xxh3()) { impl_->reset(state_); }
  void Update(const void* data, size_t bytes) { impl_->update(state_, data, bytes); }
  uint64_t Digest() const { return impl_->digest(state_); }

  static constexpr size_t kStateBytes = 640;  // XXH3_state_t is 576 bytes in xxHash 0.8

 private:
  const Xxh3Impl* impl_;
  alignas(64) unsigned char state_[kStateBytes];
};

}  // namespace kvc::storage
