#include "storage/slot_reservation.h"

#include <xxhash.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc::storage {
namespace {

// "R1", min_sequence, count, count slot numbers, XXH3-64 of everything before it. "R2"
// has sequence_bound and the next first slot (kNoSlot: none) after min_sequence. One
// encoding per record: a record with neither (the form of R1) is written as R1, and an R2
// of that form is refused.
constexpr char kTag[2] = {'R', '1'};
constexpr char kTagNext[2] = {'R', '2'};
constexpr uint64_t kNoSlot = ~uint64_t{0};

bool NeedsR2(const SlotReservation& r) { return r.sequence_bound != 0 || r.next_first_slot; }

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
  const bool r2 = NeedsR2(r);
  std::string out(r2 ? kTagNext : kTag, sizeof kTag);
  Append<uint64_t>(out, r.min_sequence);
  if (r2) {
    Append<uint64_t>(out, r.sequence_bound);
    Append<uint64_t>(out, r.next_first_slot.value_or(kNoSlot));
  }
  Append<uint32_t>(out, static_cast<uint32_t>(r.slots.size()));
  for (uint64_t s : r.slots) Append<uint64_t>(out, s);
  Append<uint64_t>(out, XXH3_64bits(out.data(), out.size()));
  return out;
}

absl::StatusOr<SlotReservation> DecodeSlotReservation(std::string_view b) {
  const bool r2 =
      b.size() >= sizeof kTagNext && std::memcmp(b.data(), kTagNext, sizeof kTagNext) == 0;
  // Tag, min_sequence, [sequence_bound, next first slot], count, checksum.
  const size_t head = sizeof kTag + 8 + (r2 ? 16 : 0);
  const size_t fixed = head + 4 + 8;
  if (b.size() < fixed || (!r2 && std::memcmp(b.data(), kTag, sizeof kTag) != 0)) {
    return absl::DataLossError(absl::StrCat("slot reservation of ", b.size(), " bytes"));
  }
  const uint32_t count = Read<uint32_t>(b, head);
  if (b.size() != fixed + uint64_t{count} * 8) {
    return absl::DataLossError(
        absl::StrCat("slot reservation of ", b.size(), " bytes lists ", count, " slots"));
  }
  if (Read<uint64_t>(b, b.size() - 8) != XXH3_64bits(b.data(), b.size() - 8)) {
    return absl::DataLossError("slot reservation checksum mismatch");
  }
  SlotReservation r;
  r.min_sequence = Read<uint64_t>(b, sizeof kTag);
  if (r2) {
    r.sequence_bound = Read<uint64_t>(b, sizeof kTag + 8);
    if (const uint64_t next = Read<uint64_t>(b, sizeof kTag + 16); next != kNoSlot)
      r.next_first_slot = next;
    if (!NeedsR2(r)) return absl::DataLossError("slot reservation R2 in the form of R1");
  }
  r.slots.resize(count);
  for (uint32_t i = 0; i < count; ++i) r.slots[i] = Read<uint64_t>(b, head + 4 + 8 * i);
  return r;
}

}  // namespace kvc::storage
