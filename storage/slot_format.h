// The on-SSD slot: a 64-byte header, then the chunk payload, padded to 4 KiB.
//
//   offset size field
//        0    4 magic "KVCS"
//        4    2 format version (1)
//        6    2 header bytes (64)
//        8    4 namespace id
//       12    4 payload bytes
//       16   16 chunk key
//       32    8 XXH3-64 of the payload
//       40    8 sequence number of the write (distinguishes reuses of a slot)
//       48    8 reserved, zero
//       56    8 XXH3-64 of bytes [0, 56)
// All little-endian. A slot is valid only if every field matches what the index expects
// and both checksums verify.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "storage/chunk_key.h"

namespace kvc::storage {

inline constexpr uint32_t kSlotMagic = 0x5343564B;  // "KVCS" read as little-endian
inline constexpr uint16_t kSlotFormatVersion = 1;
inline constexpr uint32_t kSlotHeaderBytes = 64;
inline constexpr uint32_t kSlotAlignment = 4096;

// Slot size for payloads up to max_payload_bytes: header + payload, rounded up to 4 KiB.
inline uint64_t SlotBytesFor(uint64_t max_payload_bytes) {
  return (kSlotHeaderBytes + max_payload_bytes + kSlotAlignment - 1) / kSlotAlignment *
         kSlotAlignment;
}

struct SlotHeader {
  NamespaceId namespace_id = 0;
  uint32_t payload_bytes = 0;
  ChunkKey key;
  uint64_t payload_checksum = 0;
  uint64_t sequence = 0;
};

uint64_t PayloadChecksum(std::span<const uint8_t> payload);

// Writes the header into the first kSlotHeaderBytes of `slot`.
void EncodeSlotHeader(const SlotHeader& h, uint8_t* slot);

// Checks the slot read from disk against the expected header: DataLoss naming the first
// mismatch (magic, version, header checksum, key, namespace, length, sequence, payload
// checksum). `slot` holds the header followed by at least payload_bytes of payload.
[[nodiscard]] absl::Status VerifySlot(const SlotHeader& expected, std::span<const uint8_t> slot);

}  // namespace kvc::storage
