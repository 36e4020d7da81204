#include "wire/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvc::wire {
namespace {

void PutVarint(std::string& out, uint64_t v) {
  for (;; v >>= 7) {
    if (v < 0x80) {
      out.push_back(static_cast<char>(v));
      return;
    }
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
  }
}

// Reads a varint at `pos`; false when it runs past the end or past 64 bits.
bool GetVarint(std::span<const uint8_t> in, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && pos < in.size(); shift += 7) {
    const uint8_t b = in[pos++];
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

constexpr uint8_t kKeyTag = (1 << 3) | 2;      // FetchResponse.chunk_key
constexpr uint8_t kPayloadTag = (2 << 3) | 2;  // FetchResponse.payload

}  // namespace

std::string KeyBytes(const ChunkKey& key) {
  return std::string(reinterpret_cast<const char*>(key.bytes.data()), kKeyBytes);
}

absl::StatusOr<ChunkKey> KeyFrom(std::string_view bytes, std::string_view what) {
  if (bytes.size() != kKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is ", bytes.size(),
                                                   " bytes; keys are ", kKeyBytes, " bytes"));
  }
  ChunkKey k;
  std::memcpy(k.bytes.data(), bytes.data(), kKeyBytes);
  return k;
}

std::string PackKeys(std::span<const ChunkKey> keys) {
  std::string out(keys.size() * kKeyBytes, '\0');
  for (size_t i = 0; i < keys.size(); ++i)
    std::memcpy(out.data() + kKeyBytes * i, keys[i].bytes.data(), kKeyBytes);
  return out;
}

absl::StatusOr<std::vector<ChunkKey>> UnpackKeys(std::string_view packed, size_t max_keys) {
  if (packed.size() % kKeyBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("packed_chunk_keys is ", packed.size(),
                                                   " bytes, not a whole number of 16-byte keys"));
  }
  if (packed.size() / kKeyBytes > max_keys) {
    return absl::InvalidArgumentError(absl::StrCat(
        packed.size() / kKeyBytes, " chunk keys in one call; the limit is ", max_keys));
  }
  std::vector<ChunkKey> keys(packed.size() / kKeyBytes);
  for (size_t i = 0; i < keys.size(); ++i)
    std::memcpy(keys[i].bytes.data(), packed.data() + kKeyBytes * i, kKeyBytes);
  return keys;
}

std::string FetchResponseHeader(const ChunkKey& key, uint64_t payload_bytes) {
  std::string h;
  h.reserve(2 + kKeyBytes + 1 + 10);
  h.push_back(static_cast<char>(kKeyTag));
  h.push_back(static_cast<char>(kKeyBytes));
  h.append(reinterpret_cast<const char*>(key.bytes.data()), kKeyBytes);
  h.push_back(static_cast<char>(kPayloadTag));
  PutVarint(h, payload_bytes);
  return h;
}

absl::StatusOr<FetchFrame> SplitFetchResponse(std::span<const uint8_t> m) {
  FetchFrame f;
  auto view = [&](size_t at, size_t n) {
    return std::string_view(reinterpret_cast<const char*>(m.data()) + at, n);
  };
  // The daemon's own framing: the key field, then the payload field, nothing else.
  if (m.size() > 19 && m[0] == kKeyTag && m[1] == kKeyBytes && m[18] == kPayloadTag) {
    size_t pos = 19;
    uint64_t len = 0;
    if (GetVarint(m, pos, len) && pos + len == m.size()) {
      f.key = view(2, kKeyBytes);
      f.payload = m.subspan(pos);
      return f;
    }
  }
  size_t pos = 0;
  while (pos < m.size()) {
    uint64_t tag = 0, len = 0;
    const size_t field_at = pos;
    if (!GetVarint(m, pos, tag)) {
      return absl::DataLossError(
          absl::StrCat("FetchResponse: a malformed varint at byte ", field_at, " of ", m.size()));
    }
    if ((tag & 7) != 2) {
      return absl::DataLossError(
          absl::StrCat("FetchResponse: field ", tag >> 3, " has wire type ", tag & 7));
    }
    if (!GetVarint(m, pos, len) || len > m.size() - pos) {
      return absl::DataLossError(absl::StrCat("FetchResponse: field ", tag >> 3, " (", len,
                                              " bytes at byte ", pos, ") runs past the message (",
                                              m.size(), " bytes)"));
    }
    if (tag >> 3 == 1) f.key = view(pos, len);
    if (tag >> 3 == 2) f.payload = m.subspan(pos, len);
    pos += len;
  }
  return f;
}

}  // namespace kvc::wire
