// libFuzzer target: the slot reservation record an index holds (storage/slot_reservation.h),
// read at every open to decide which slots to rebuild entries from. Whatever the bytes, the
// decoder never reads past them, and what it accepts is exactly its own encoding (the
// record has no slack: a checksum covers every byte).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/check.h"
#include "storage/slot_reservation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvc::storage::SlotReservation> r = kvc::storage::DecodeSlotReservation(bytes);
  if (r.ok()) {
    KVC_CHECK(kvc::storage::EncodeSlotReservation(*r) == bytes)
        << "an accepted reservation is not its own encoding";
  }
  return 0;
}
