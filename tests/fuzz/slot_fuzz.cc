// libFuzzer target: the SSD slot check. The input is a slot as read from disk (header and
// payload) and the first bytes also choose what the index expects. Whatever the bytes,
// VerifySlot answers OK only if every field and both checksums match — checked here by
// decoding the header and comparing — and never reads past the slot; what the index
// rebuild decodes (DecodeSlotHeader + VerifyPayload) lies inside the slot and re-encodes
// to the same header fields.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "base/check.h"
#include "storage/slot_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvc::storage::SlotHeader;
  if (size < 24) return 0;
  SlotHeader expected;
  std::memcpy(&expected.namespace_id, data, 4);
  std::memcpy(expected.key.bytes.data(), data + 4, 16);
  uint32_t len = 0;
  std::memcpy(&len, data + 20, 4);
  data += 24;
  size -= 24;
  // The slot as read: header + payload, exactly as long as the input (a short read).
  std::vector<uint8_t> slot(data, data + size);
  expected.payload_bytes = slot.size() >= kvc::storage::kSlotHeaderBytes
                               ? len % (slot.size() - kvc::storage::kSlotHeaderBytes + 1)
                               : len % 64;
  expected.sequence = len;
  if (slot.size() >= kvc::storage::kSlotHeaderBytes) {
    expected.payload_checksum = kvc::storage::PayloadChecksum(
        std::span(slot).subspan(kvc::storage::kSlotHeaderBytes, expected.payload_bytes));
  }
  const absl::Status verdict = kvc::storage::VerifySlot(expected, slot);
  absl::StatusOr<kvc::storage::DecodedSlot> decoded = kvc::storage::DecodeSlotHeader(slot);
  if (verdict.ok()) {
    // Accepted: then the header on disk says exactly what was expected.
    KVC_CHECK(decoded.ok()) << "VerifySlot accepted a header that does not decode";
    const SlotHeader& h = decoded->header;
    KVC_CHECK(h.key == expected.key && h.namespace_id == expected.namespace_id &&
              h.payload_bytes == expected.payload_bytes && h.sequence == expected.sequence &&
              h.payload_checksum == expected.payload_checksum)
        << "VerifySlot accepted a header that differs from the expected one";
    KVC_CHECK(slot.size() >= decoded->header_bytes + uint64_t{expected.payload_bytes});
  }
  if (decoded.ok() && kvc::storage::VerifyPayload(*decoded, slot).ok()) {
    // What an index rebuild would adopt: inside the slot, and its own encoding again.
    KVC_CHECK(slot.size() >= decoded->header_bytes + uint64_t{decoded->header.payload_bytes});
    std::vector<uint8_t> again(decoded->header_bytes);
    kvc::storage::EncodeSlotHeader(decoded->header, again.data(), decoded->version);
    absl::StatusOr<kvc::storage::DecodedSlot> twice = kvc::storage::DecodeSlotHeader(again);
    KVC_CHECK(twice.ok() && twice->header.key == decoded->header.key &&
              twice->header.sequence == decoded->header.sequence &&
              twice->header.parent == decoded->header.parent &&
              twice->header.expires_s == decoded->header.expires_s)
        << "a decoded header does not survive its own encoding";
  }
  // And a slot written from the expected header always verifies.
  if (slot.size() >= kvc::storage::kSlotHeaderBytes + expected.payload_bytes) {
    kvc::storage::EncodeSlotHeader(expected, slot.data());
    KVC_CHECK(kvc::storage::VerifySlot(expected, slot).ok()) << "a freshly encoded slot fails";
  }
  return 0;
}
