// Prefix identity, public so any client in any language computes the same keys
// (docs/prefix-hashing.md has the byte encoding; tests/cachesvc/prefix_hash_vectors.json
// the test vectors).
//
//   model fingerprint = XXH3-128("kvcache-model-v1" ‖ str(model_id) ‖ u32 sections ‖
//                                per section: u32 layer, u32 kind, u64 positions, u64 bytes)
//   root key          = XXH3-128("kvcache-ns-v1" ‖ str(tenant) ‖ fingerprint ‖
//                                u32 kv_layout_version ‖ u32 chunk_tokens)
//   key_i             = XXH3-128(key_{i-1} ‖ chunk i's token ids as u32), key_0 = root
// Caller-keyed namespaces (keys chosen by a serving engine, not derived from tokens):
//   caller root       = XXH3-128("kvcache-caller-ns-v1" ‖ str(tenant) ‖ str(model_id) ‖
//                                u64 page_bytes ‖ u32 page_tokens)
//   chunk key         = XXH3-128("kvcache-caller-key-v1" ‖ caller root ‖ str(caller key))
// where str(s) = u32 byte length ‖ UTF-8 bytes, integers are little-endian, XXH3-128 has
// seed 0, and a 128-bit digest is written in XXH3's canonical (big-endian) byte order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/chunk_key.h"
#include "engine/spec/chunk_layout.h"

namespace kvc::client {

using storage::ChunkKey;

ChunkKey ModelFingerprint(const std::string& model_id, const ChunkLayout& layout);
ChunkKey NamespaceRoot(const std::string& tenant, const ChunkKey& model_fingerprint,
                       uint32_t kv_layout_version, uint32_t chunk_tokens);
// The key of the chunk after `parent` holding `tokens` (one whole chunk).
ChunkKey NextChunkKey(const ChunkKey& parent, std::span<const uint32_t> tokens);
// The key storage holds a chunk under in a namespace with bound keys: XXH3-128(
// "kvcache-scope-v1" ‖ root key ‖ chunk key). Server-side only (clients never see it).
// Kept for namespaces bound this way; new ones use BoundChunkKeyV2: this input has the
// shape of a token-chain step (16-byte parent ‖ 8 token ids), so a legacy unbound token
// namespace could reach it with a chosen parent.
ChunkKey BoundChunkKey(const ChunkKey& root, const ChunkKey& key);
// The same binding, domain-separated: XXH3-128("kvcache-scope-v2:" ‖ root key ‖ chunk key),
// 49 bytes. Every token-chain step hashes 16 + 4·n bytes, so none can produce it.
ChunkKey BoundChunkKeyV2(const ChunkKey& root, const ChunkKey& key);
inline constexpr char kBindingTagV2[] = "kvcache-scope-v2:";  // 17 bytes, no terminator
// The root of a caller-keyed namespace (the server computes it; clients read it from the
// RegisterNamespace answer).
ChunkKey CallerNamespaceRoot(const std::string& tenant, const std::string& model_id,
                             uint64_t page_bytes, uint32_t page_tokens);
// The longest key a caller may choose (SGLang's page hash is 64 hex characters).
inline constexpr size_t kMaxCallerKeyBytes = 64;
// The chunk key of the caller's key `caller_key` (1..kMaxCallerKeyBytes bytes, any bytes)
// in the caller-keyed namespace with root `root`.
ChunkKey CallerChunkKey(const ChunkKey& root, std::string_view caller_key);
// Keys of every whole chunk of `tokens`, chained from `root`; a partial tail is ignored.
std::vector<ChunkKey> ChunkKeys(const ChunkKey& root, std::span<const uint32_t> tokens,
                                uint32_t chunk_tokens);

}  // namespace kvc::client
