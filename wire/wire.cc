#include "wire/wire.h"

#include <algorithm>
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

namespace {

constexpr uint64_t kStorePayloadField = 4;  // StoreRequest.payload

// Bytes read across pieces, in order.
class PieceReader {
 public:
  explicit PieceReader(std::span<const std::span<const uint8_t>> pieces) : pieces_(pieces) {
    Skip();
  }
  bool done() const { return piece_ == pieces_.size(); }
  uint64_t at() const { return at_; }
  // A varint, its bytes appended to `raw`; false when it runs out or past 64 bits.
  bool Varint(uint64_t& v, std::string& raw) {
    v = 0;
    for (int shift = 0; shift < 64 && !done(); shift += 7) {
      const uint8_t b = pieces_[piece_][offset_];
      Advance(1);
      raw.push_back(static_cast<char>(b));
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // The next n bytes, appended to `copy` or, with copy null, as views into `views`; false
  // when fewer than n are left.
  bool Take(uint64_t n, std::string* copy, std::vector<std::span<const uint8_t>>* views) {
    while (n > 0) {
      if (done()) return false;
      const std::span<const uint8_t> rest = pieces_[piece_].subspan(offset_);
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, rest.size()));
      if (copy != nullptr) {
        copy->append(reinterpret_cast<const char*>(rest.data()), k);
      } else {
        views->push_back(rest.first(k));
      }
      Advance(k);
      n -= k;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    at_ += n;
    Skip();
  }
  // Past the pieces used up (and empty ones).
  void Skip() {
    while (piece_ < pieces_.size() && offset_ == pieces_[piece_].size()) {
      ++piece_;
      offset_ = 0;
    }
  }
  std::span<const std::span<const uint8_t>> pieces_;
  size_t piece_ = 0, offset_ = 0;
  uint64_t at_ = 0;
};

}  // namespace

std::string StorePayloadHeader(uint64_t payload_bytes) {
  std::string h(1, static_cast<char>((kStorePayloadField << 3) | 2));
  PutVarint(h, payload_bytes);
  return h;
}

namespace {

// Splits a message in pieces around its length-delimited field `payload_field` (the
// last one, as protobuf keeps): SplitStoreRequest and SplitFetchResponsePieces.
absl::Status SplitAroundPayload(std::span<const std::span<const uint8_t>> pieces,
                                uint64_t payload_field, const char* message, StoreFrame* out) {
  out->rest.clear();
  out->payload.clear();
  out->payload_bytes = 0;
  PieceReader in(pieces);
  auto bad = [&](uint64_t at, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a ", message, " (", what, " at byte ", at, ")"));
  };
  while (!in.done()) {
    const uint64_t field_at = in.at();
    std::string header;  // the field's tag (and length) as encoded
    uint64_t tag = 0;
    if (!in.Varint(tag, header)) return bad(field_at, "a malformed tag");
    if (tag >> 3 == 0) return bad(field_at, "field number 0");
    bool ok = true;
    switch (tag & 7) {
      case 0: {  // varint
        uint64_t v = 0;
        ok = in.Varint(v, header);
        out->rest += header;
        break;
      }
      case 1:  // fixed64
      case 5:  // fixed32
        out->rest += header;
        ok = in.Take((tag & 7) == 1 ? 8 : 4, &out->rest, nullptr);
        break;
      case 2: {  // length-delimited
        uint64_t len = 0;
        if (!in.Varint(len, header)) return bad(field_at, "a malformed length");
        if (tag >> 3 == payload_field) {
          out->payload.clear();  // the last payload field is the payload
          out->payload_bytes = len;
          ok = in.Take(len, nullptr, &out->payload);
        } else {
          out->rest += header;
          ok = in.Take(len, &out->rest, nullptr);
        }
        break;
      }
      default:
        return bad(field_at, absl::StrCat("wire type ", tag & 7));
    }
    if (!ok) return bad(field_at, absl::StrCat("field ", tag >> 3, " running past the end"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SplitStoreRequest(std::span<const std::span<const uint8_t>> pieces, StoreFrame* out) {
  return SplitAroundPayload(pieces, kStorePayloadField, "StoreRequest", out);
}

absl::Status SplitFetchResponsePieces(std::span<const std::span<const uint8_t>> pieces,
                                      StoreFrame* out) {
  return SplitAroundPayload(pieces, kPayloadTag >> 3, "FetchResponse", out);
}

absl::StatusOr<std::string> FetchResponseKeyField(std::string_view rest) {
  const std::span<const uint8_t> whole(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  StoreFrame key;  // the key's field split out as the "payload"
  if (absl::Status s =
          SplitAroundPayload(std::span(&whole, 1), kKeyTag >> 3, "FetchResponse", &key);
      !s.ok()) {
    return s;
  }
  std::string out;
  for (std::span<const uint8_t> p : key.payload) out.append(p.begin(), p.end());
  return out;
}

absl::Status CheckFetchAnswer(std::span<const std::span<const uint8_t>> pieces,
                              const uint8_t* want_key, uint64_t chunk_bytes, StoreFrame* frame) {
  if (absl::Status s = SplitFetchResponsePieces(pieces, frame); !s.ok())
    return absl::DataLossError(s.message());
  if (want_key == nullptr) return absl::DataLossError("an answer past the last chunk asked for");
  absl::StatusOr<std::string> key = FetchResponseKeyField(frame->rest);
  if (!key.ok()) return absl::DataLossError(key.status().message());
  if (key->size() != kKeyBytes || std::memcmp(key->data(), want_key, kKeyBytes) != 0)
    return absl::DataLossError("another chunk than asked for");
  if (frame->payload_bytes != chunk_bytes) {
    return absl::DataLossError(absl::StrCat("a payload of ", frame->payload_bytes,
                                            " bytes; this namespace's chunks are ", chunk_bytes));
  }
  return absl::OkStatus();
}

}  // namespace kvc::wire
