// The on-SSD slot: a header, then the chunk payload, padded to 4 KiB. Slots describe
// themselves: after a crash the index is rebuilt from them (chunk_store_recovery.cc).
//
// Format 3 (folders with size classes, storage v3) is format 2's header with version 3: a
// folder marked format 3 keeps slots of several sizes (docs/storage.md), which a kvcached
// of before then refuses to open (it knows formats 1 and 2 only). A folder's first class
// keeps the format it was made with.
//
// Format 2 (folders made since storage v2), a 128-byte header:
//   offset size field
//        0    4 magic "KVCS"
//        4    2 format version (2)
//        6    2 header bytes (128)
//        8    4 namespace id
//       12    4 payload bytes
//       16   16 chunk key
//       32    8 XXH3-64 of the payload
//       40    8 sequence number of the write (distinguishes reuses of a slot)
//       48   16 parent chunk key (zero without a parent)
//       64    4 flags: bit 0 = the chunk has a parent, bit 1 = it has an origin key,
//                bit 2 = its origin has a parent key
//       68    4 reserved, zero
//       72    8 created, unix seconds
//       80    8 TTL expiry, unix seconds (0: none)
//       88   16 origin key: the key the client stored the chunk under (ChunkOrigin)
//      104   16 origin parent key
//      120    8 XXH3-64 of bytes [0, 120)
// (Slots written before origins were kept have flag bits 1 and 2 clear and zeros at 88–119,
// which every reader of format 2 ignores: the format did not change.)
// Format 1 (older folders), a 64-byte header: bytes 0–47 as above (version 1, header
// bytes 64), 48–55 reserved, 56 XXH3-64 of bytes [0, 56). It has no parent or times.
// All little-endian. A folder keeps the format it was made with (its index says which).
// A slot is valid only if its header checksum verifies, every field matches what the
// reader expects and the payload checksum verifies.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/chunk_key.h"

namespace kvc::storage {

inline constexpr uint32_t kSlotMagic = 0x5343564B;  // "KVCS" read as little-endian
inline constexpr uint16_t kSlotFormatVersion = 3;   // what new folders are made with
inline constexpr uint32_t kSlotHeaderBytes = 128;   // formats 2 and 3's header
inline constexpr uint32_t kSlotHeaderBytesV1 = 64;
inline constexpr uint32_t kSlotAlignment = 4096;

// The header size of a slot format (1, 2 or 3); 0 for any other.
// (Inline, as SlotBytesFor: programs and tests that link no storage code size slots too.)
inline constexpr uint32_t SlotHeaderBytes(uint16_t version) {
  switch (version) {
    case 1:
      return kSlotHeaderBytesV1;
    case 2:
    case 3:
      return kSlotHeaderBytes;
  }
  return 0;
}

// Slot size for payloads up to max_payload_bytes: header + payload, rounded up to 4 KiB.
inline uint64_t SlotBytesFor(uint64_t max_payload_bytes, uint16_t version = kSlotFormatVersion) {
  return (SlotHeaderBytes(version) + max_payload_bytes + kSlotAlignment - 1) / kSlotAlignment *
         kSlotAlignment;
}

struct SlotHeader {
  NamespaceId namespace_id = 0;
  uint32_t payload_bytes = 0;
  ChunkKey key;
  uint64_t payload_checksum = 0;
  uint64_t sequence = 0;
  // Format 2 only (format 1 reads back none and zeros).
  std::optional<ChunkKey> parent;
  int64_t created_s = 0;
  int64_t expires_s = 0;
  std::optional<ChunkOrigin> origin;
};

uint64_t PayloadChecksum(std::span<const uint8_t> payload);
// Copies src into dst (same size) and returns PayloadChecksum(src) in one pass over the
// bytes: block by block, each hashed while it is still in cache from its copy.
uint64_t CopyWithChecksum(std::span<uint8_t> dst, std::span<const uint8_t> src);

// Writes the header (format `version`) into the first SlotHeaderBytes(version) of `slot`.
void EncodeSlotHeader(const SlotHeader& h, uint8_t* slot, uint16_t version = kSlotFormatVersion);

// A header read back: its fields once magic, version, size and header checksum verify
// (DataLoss naming the first that does not). The payload is not checked here.
struct DecodedSlot {
  SlotHeader header;
  uint16_t version = 0;
  uint32_t header_bytes = 0;
};
absl::StatusOr<DecodedSlot> DecodeSlotHeader(std::span<const uint8_t> slot);

// The slot's payload against the decoded header's length and checksum. `slot` holds the
// header followed by the payload.
[[nodiscard]] absl::Status VerifyPayload(const DecodedSlot& d, std::span<const uint8_t> slot);

// Checks a slot read from disk against the header the index expects (namespace, key,
// length, sequence, payload checksum; parent and times are not compared): DataLoss naming
// the first mismatch. Either format is accepted. On success *payload_offset (if given) is
// where the payload starts.
[[nodiscard]] absl::Status VerifySlot(const SlotHeader& expected, std::span<const uint8_t> slot,
                                      uint32_t* payload_offset = nullptr);

}  // namespace kvc::storage
