// A C entry point to the public key derivation (prefix_hash.h) for Python's ctypes
// (python/kvcache/hashing.py): one call hashes a whole prefix, where pure Python makes one
// call per chunk (a 1M-token prefix: ~4 ms of Python, well under 1 ms here). Built into
// python/kvcache/libkvcache_hash.so by python/CMakeLists.txt; Python falls back to its own
// loop (same keys, held to the same vectors) when the library is absent.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "client/prefix_hash.h"

extern "C" {

// The keys of every whole chunk of tokens[0, n_tokens) chained from the 16-byte `root`,
// written to `out` (16 bytes a key; room for n_tokens / chunk_tokens). Returns the keys
// written: 0 when chunk_tokens is 0.
__attribute__((visibility("default"))) uint64_t kvc_chunk_keys(const uint8_t* root,
                                                               const uint32_t* tokens,
                                                               uint64_t n_tokens,
                                                               uint32_t chunk_tokens,
                                                               uint8_t* out) {
  kvc::client::ChunkKey start;
  std::memcpy(start.bytes.data(), root, 16);
  const std::vector<kvc::client::ChunkKey> keys =
      kvc::client::ChunkKeys(start, std::span(tokens, n_tokens), chunk_tokens);
  for (size_t i = 0; i < keys.size(); ++i) std::memcpy(out + 16 * i, keys[i].bytes.data(), 16);
  return keys.size();
}

}  // extern "C"
