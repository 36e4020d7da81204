#include "storage/slot_format.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_cat.h"

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

}  // namespace

uint64_t PayloadChecksum(std::span<const uint8_t> payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

void EncodeSlotHeader(const SlotHeader& h, uint8_t* slot) {
  std::memset(slot, 0, kSlotHeaderBytes);
  Put<uint32_t>(slot, 0, kSlotMagic);
  Put<uint16_t>(slot, 4, kSlotFormatVersion);
  Put<uint16_t>(slot, 6, static_cast<uint16_t>(kSlotHeaderBytes));
  Put<uint32_t>(slot, 8, h.namespace_id);
  Put<uint32_t>(slot, 12, h.payload_bytes);
  std::memcpy(slot + 16, h.key.bytes.data(), 16);
  Put<uint64_t>(slot, 32, h.payload_checksum);
  Put<uint64_t>(slot, 40, h.sequence);
  Put<uint64_t>(slot, 56, XXH3_64bits(slot, 56));
}

absl::Status VerifySlot(const SlotHeader& want, std::span<const uint8_t> slot) {
  const std::string where = absl::StrCat("chunk ", want.key.Hex(), ": ");
  if (slot.size() < kSlotHeaderBytes + want.payload_bytes) {
    return absl::DataLossError(absl::StrCat(where, "slot read is ", slot.size(), " bytes, need ",
                                            kSlotHeaderBytes + want.payload_bytes));
  }
  const uint8_t* p = slot.data();
  if (Get<uint32_t>(p, 0) != kSlotMagic) return absl::DataLossError(where + "bad slot magic");
  if (Get<uint16_t>(p, 4) != kSlotFormatVersion) {
    return absl::DataLossError(absl::StrCat(where, "slot format version ", Get<uint16_t>(p, 4)));
  }
  if (Get<uint64_t>(p, 56) != XXH3_64bits(p, 56)) {
    return absl::DataLossError(where + "slot header checksum mismatch");
  }
  if (std::memcmp(p + 16, want.key.bytes.data(), 16) != 0) {
    return absl::DataLossError(where + "slot holds another chunk");
  }
  if (Get<uint32_t>(p, 8) != want.namespace_id || Get<uint32_t>(p, 12) != want.payload_bytes ||
      Get<uint64_t>(p, 40) != want.sequence) {
    return absl::DataLossError(where + "slot header does not match the index");
  }
  if (Get<uint64_t>(p, 32) != want.payload_checksum ||
      PayloadChecksum(slot.subspan(kSlotHeaderBytes, want.payload_bytes)) !=
          want.payload_checksum) {
    return absl::DataLossError(where + "payload checksum mismatch");
  }
  return absl::OkStatus();
}

}  // namespace kvc::storage
