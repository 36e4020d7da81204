// libFuzzer target: the SSD slot check. The input is a slot as read from disk (header and
// payload) and the first bytes also choose what the index expects. Whatever the bytes,
// VerifySlot answers OK only if every field and both checksums match — checked here by
// re-encoding the expected header and comparing — and never reads past the slot.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "engine/spec/check.h"
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
  if (verdict.ok()) {
    // Accepted: then the header on disk is exactly the expected one.
    KVC_CHECK(slot.size() >= kvc::storage::kSlotHeaderBytes + expected.payload_bytes);
    std::vector<uint8_t> encoded(kvc::storage::kSlotHeaderBytes);
    kvc::storage::EncodeSlotHeader(expected, encoded.data());
    KVC_CHECK(std::memcmp(encoded.data(), slot.data(), encoded.size()) == 0)
        << "VerifySlot accepted a header that differs from the expected one";
  }
  // And a slot written from the expected header always verifies.
  if (slot.size() >= kvc::storage::kSlotHeaderBytes + expected.payload_bytes) {
    kvc::storage::EncodeSlotHeader(expected, slot.data());
    KVC_CHECK(kvc::storage::VerifySlot(expected, slot).ok()) << "a freshly encoded slot fails";
  }
  return 0;
}
