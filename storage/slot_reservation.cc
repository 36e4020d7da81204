#include "storage/slot_reservation.h"

#include <xxhash.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc::storage {
namespace {

// "R1", min_sequence, count, count slot numbers, XXH3-64 of everything before it.
constexpr char kTag[2] = {'R', '1'};

template <typename T>
void Append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T Read(std::string_view b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

}  // namespace

std::string EncodeSlotReservation(const SlotReservation& r) {
  std::string out(kTag, sizeof kTag);
  Append<uint64_t>(out, r.min_sequence);
  Append<uint32_t>(out, static_cast<uint32_t>(r.slots.size()));
  for (uint64_t s : r.slots) Append<uint64_t>(out, s);
  Append<uint64_t>(out, XXH3_64bits(out.data(), out.size()));
  return out;
}

absl::StatusOr<SlotReservation> DecodeSlotReservation(std::string_view b) {
  constexpr size_t kFixed = sizeof kTag + 8 + 4 + 8;
  if (b.size() < kFixed || std::memcmp(b.data(), kTag, sizeof kTag) != 0) {
    return absl::DataLossError(absl::StrCat("slot reservation of ", b.size(), " bytes"));
  }
  const uint32_t count = Read<uint32_t>(b, sizeof kTag + 8);
  if (b.size() != kFixed + uint64_t{count} * 8) {
    return absl::DataLossError(
        absl::StrCat("slot reservation of ", b.size(), " bytes lists ", count, " slots"));
  }
  if (Read<uint64_t>(b, b.size() - 8) != XXH3_64bits(b.data(), b.size() - 8)) {
    return absl::DataLossError("slot reservation checksum mismatch");
  }
  SlotReservation r;
  r.min_sequence = Read<uint64_t>(b, sizeof kTag);
  r.slots.resize(count);
  for (uint32_t i = 0; i < count; ++i) r.slots[i] = Read<uint64_t>(b, sizeof kTag + 12 + 8 * i);
  return r;
}

}  // namespace kvc::storage
