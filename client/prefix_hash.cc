#include "client/prefix_hash.h"

#include <xxhash.h>

#include <bit>
#include <cstring>

namespace kvc::client {
namespace {

static_assert(std::endian::native == std::endian::little, "encodings are little-endian");

class Encoder {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void U32(uint32_t v) { Bytes(&v, 4); }
  void U64(uint64_t v) { Bytes(&v, 8); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  void Key(const ChunkKey& k) { Bytes(k.bytes.data(), 16); }
  ChunkKey Hash() const { return Hash128(out_.data(), out_.size()); }

  static ChunkKey Hash128(const void* p, size_t n) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    ChunkKey k;
    std::memcpy(k.bytes.data(), c.digest, 16);
    return k;
  }

 private:
  std::vector<uint8_t> out_;
};

}  // namespace

ChunkKey ModelFingerprint(const std::string& model_id, const ChunkLayout& layout) {
  Encoder e;
  e.Bytes("kvcache-model-v1", 16);
  e.Str(model_id);
  e.U32(static_cast<uint32_t>(layout.sections.size()));
  for (const ChunkSection& s : layout.sections) {
    e.U32(static_cast<uint32_t>(s.layer));
    e.U32(static_cast<uint32_t>(s.kind));
    e.U64(static_cast<uint64_t>(s.positions));
    e.U64(static_cast<uint64_t>(s.bytes));
  }
  return e.Hash();
}

ChunkKey NamespaceRoot(const std::string& tenant, const ChunkKey& model_fingerprint,
                       uint32_t kv_layout_version, uint32_t chunk_tokens) {
  Encoder e;
  e.Bytes("kvcache-ns-v1", 13);
  e.Str(tenant);
  e.Key(model_fingerprint);
  e.U32(kv_layout_version);
  e.U32(chunk_tokens);
  return e.Hash();
}

ChunkKey NextChunkKey(const ChunkKey& parent, std::span<const uint32_t> tokens) {
  // One contiguous buffer: parent (16 B) then the token ids, little-endian u32. On the
  // stack for chunks of up to 2,044 tokens: a 1M-token prefix is thousands of calls, and a
  // heap buffer each cost more than the hash of a small chunk.
  constexpr size_t kStackBytes = 8192;
  const size_t n = 16 + tokens.size_bytes();
  alignas(64) uint8_t stack[kStackBytes];
  std::vector<uint8_t> heap;
  uint8_t* buf = stack;
  if (n > kStackBytes) {
    heap.resize(n);
    buf = heap.data();
  }
  std::memcpy(buf, parent.bytes.data(), 16);
  std::memcpy(buf + 16, tokens.data(), tokens.size_bytes());
  return Encoder::Hash128(buf, n);
}

ChunkKey BoundChunkKey(const ChunkKey& root, const ChunkKey& key) {
  // The Encoder's encoding, in a fixed 48-byte buffer: a daemon binds every key of every
  // Lookup and Fetch (thousands a call), and the Encoder's growing vector cost three heap
  // allocations a key — a fifth of a 1M-token Lookup's server CPU.
  uint8_t buf[48];
  std::memcpy(buf, "kvcache-scope-v1", 16);
  std::memcpy(buf + 16, root.bytes.data(), 16);
  std::memcpy(buf + 32, key.bytes.data(), 16);
  return Encoder::Hash128(buf, sizeof buf);
}

ChunkKey BoundChunkKeyV2(const ChunkKey& root, const ChunkKey& key) {
  constexpr size_t kTag = sizeof kBindingTagV2 - 1;
  static_assert(kTag == 17 && (kTag + 32) % 4 != 0,
                "the binding's length must not be 16 + 4n, a token-chain step's");
  uint8_t buf[kTag + 32];
  std::memcpy(buf, kBindingTagV2, kTag);
  std::memcpy(buf + kTag, root.bytes.data(), 16);
  std::memcpy(buf + kTag + 16, key.bytes.data(), 16);
  return Encoder::Hash128(buf, sizeof buf);
}

ChunkKey CallerNamespaceRoot(const std::string& tenant, const std::string& model_id,
                             uint64_t page_bytes, uint32_t page_tokens) {
  Encoder e;
  e.Bytes("kvcache-caller-ns-v1", 20);
  e.Str(tenant);
  e.Str(model_id);
  e.U64(page_bytes);
  e.U32(page_tokens);
  return e.Hash();
}

ChunkKey CallerChunkKey(const ChunkKey& root, std::string_view caller_key) {
  Encoder e;
  e.Bytes("kvcache-caller-key-v1", 21);
  e.Key(root);
  e.Str(caller_key);
  return e.Hash();
}

std::vector<ChunkKey> ChunkKeys(const ChunkKey& root, std::span<const uint32_t> tokens,
                                uint32_t chunk_tokens) {
  std::vector<ChunkKey> keys;
  if (chunk_tokens > 0) keys.reserve(tokens.size() / chunk_tokens);
  ChunkKey prev = root;
  for (size_t at = 0; chunk_tokens > 0 && at + chunk_tokens <= tokens.size(); at += chunk_tokens) {
    prev = NextChunkKey(prev, tokens.subspan(at, chunk_tokens));
    keys.push_back(prev);
  }
  return keys;
}

}  // namespace kvc::client
