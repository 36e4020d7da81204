#include "storage/slot_format.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "storage/payload.h"
#include "storage/xxh3.h"

namespace kvc::storage {
namespace {

template <typename T>
void Put(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof v);  // the project is little-endian only (static_assert in kvfmt)
}
template <typename T>
T Get(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof v);
  return v;
}

constexpr uint32_t kHasParent = 1;
constexpr uint32_t kHasOrigin = 2;
constexpr uint32_t kOriginHasParent = 4;

}  // namespace

uint64_t PayloadChecksum(std::span<const uint8_t> payload) {
  return Xxh3Hash(payload.data(), payload.size());
}

uint64_t CopyWithChecksum(std::span<uint8_t> dst, std::span<const uint8_t> src) {
  KVC_CHECK(dst.size() == src.size())
      << "CopyWithChecksum of " << src.size() << " bytes into " << dst.size();
  return Payload(src).CopyWithChecksum(dst.data());
}

void EncodeSlotHeader(const SlotHeader& h, uint8_t* slot, uint16_t version) {
  const uint32_t bytes = SlotHeaderBytes(version);
  std::memset(slot, 0, bytes);
  Put<uint32_t>(slot, 0, kSlotMagic);
  Put<uint16_t>(slot, 4, version);
  Put<uint16_t>(slot, 6, static_cast<uint16_t>(bytes));
  Put<uint32_t>(slot, 8, h.namespace_id);
  Put<uint32_t>(slot, 12, h.payload_bytes);
  std::memcpy(slot + 16, h.key.bytes.data(), 16);
  Put<uint64_t>(slot, 32, h.payload_checksum);
  Put<uint64_t>(slot, 40, h.sequence);
  if (version >= 2) {
    uint32_t flags = 0;
    if (h.parent) {
      std::memcpy(slot + 48, h.parent->bytes.data(), 16);
      flags |= kHasParent;
    }
    if (h.origin) {
      std::memcpy(slot + 88, h.origin->key.bytes.data(), 16);
      flags |= kHasOrigin;
      if (h.origin->parent) {
        std::memcpy(slot + 104, h.origin->parent->bytes.data(), 16);
        flags |= kOriginHasParent;
      }
    }
    Put<uint32_t>(slot, 64, flags);
    Put<int64_t>(slot, 72, h.created_s);
    Put<int64_t>(slot, 80, h.expires_s);
  }
  Put<uint64_t>(slot, bytes - 8, XXH3_64bits(slot, bytes - 8));
}

absl::StatusOr<DecodedSlot> DecodeSlotHeader(std::span<const uint8_t> slot) {
  const uint8_t* p = slot.data();
  if (slot.size() < kSlotHeaderBytesV1) {
    return absl::DataLossError(absl::StrCat("slot read is ", slot.size(), " bytes"));
  }
  if (Get<uint32_t>(p, 0) != kSlotMagic) return absl::DataLossError("bad slot magic");
  DecodedSlot d;
  d.version = Get<uint16_t>(p, 4);
  d.header_bytes = SlotHeaderBytes(d.version);
  if (d.header_bytes == 0) {
    return absl::DataLossError(absl::StrCat("slot format version ", d.version));
  }
  if (Get<uint16_t>(p, 6) != d.header_bytes || slot.size() < d.header_bytes) {
    return absl::DataLossError(absl::StrCat("slot header of ", Get<uint16_t>(p, 6), " bytes"));
  }
  if (Get<uint64_t>(p, d.header_bytes - 8) != XXH3_64bits(p, d.header_bytes - 8)) {
    return absl::DataLossError("slot header checksum mismatch");
  }
  SlotHeader& h = d.header;
  h.namespace_id = Get<uint32_t>(p, 8);
  h.payload_bytes = Get<uint32_t>(p, 12);
  std::memcpy(h.key.bytes.data(), p + 16, 16);
  h.payload_checksum = Get<uint64_t>(p, 32);
  h.sequence = Get<uint64_t>(p, 40);
  if (d.version >= 2) {
    const uint32_t flags = Get<uint32_t>(p, 64);
    if (flags & kHasParent) {
      ChunkKey parent;
      std::memcpy(parent.bytes.data(), p + 48, 16);
      h.parent = parent;
    }
    if (flags & kHasOrigin) {
      ChunkOrigin origin;
      std::memcpy(origin.key.bytes.data(), p + 88, 16);
      if (flags & kOriginHasParent) {
        ChunkKey parent;
        std::memcpy(parent.bytes.data(), p + 104, 16);
        origin.parent = parent;
      }
      h.origin = origin;
    }
    h.created_s = Get<int64_t>(p, 72);
    h.expires_s = Get<int64_t>(p, 80);
  }
  return d;
}

absl::Status VerifyPayload(const DecodedSlot& d, std::span<const uint8_t> slot) {
  if (slot.size() < uint64_t{d.header_bytes} + d.header.payload_bytes) {
    return absl::DataLossError(absl::StrCat("slot read is ", slot.size(), " bytes, need ",
                                            d.header_bytes + uint64_t{d.header.payload_bytes}));
  }
  if (PayloadChecksum(slot.subspan(d.header_bytes, d.header.payload_bytes)) !=
      d.header.payload_checksum) {
    return absl::DataLossError("payload checksum mismatch");
  }
  return absl::OkStatus();
}

absl::Status VerifySlot(const SlotHeader& want, std::span<const uint8_t> slot,
                        uint32_t* payload_offset) {
  const std::string where = absl::StrCat("chunk ", want.key.Hex(), ": ");
  absl::StatusOr<DecodedSlot> d = DecodeSlotHeader(slot);
  if (!d.ok()) return absl::DataLossError(where + std::string(d.status().message()));
  const SlotHeader& h = d->header;
  if (h.key != want.key) return absl::DataLossError(where + "slot holds another chunk");
  if (h.namespace_id != want.namespace_id || h.payload_bytes != want.payload_bytes ||
      h.sequence != want.sequence) {
    return absl::DataLossError(where + "slot header does not match the index");
  }
  if (h.payload_checksum != want.payload_checksum) {
    return absl::DataLossError(where + "payload checksum mismatch");
  }
  if (absl::Status s = VerifyPayload(*d, slot); !s.ok()) {
    return absl::DataLossError(where + std::string(s.message()));
  }
  if (payload_offset != nullptr) *payload_offset = d->header_bytes;
  return absl::OkStatus();
}

}  // namespace kvc::storage
