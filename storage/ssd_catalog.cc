#include "storage/ssd_catalog.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "base/check.h"

namespace kvc::storage {

const char* SsdCatalog::PlaceName(Place p) {
  switch (p) {
    case Place::kFree:
      return "free";
    case Place::kReservedFree:
      return "free in the reservation";
    case Place::kNamedNext:
      return "the next reservation's first";
    case Place::kReserving:
      return "being reserved";
    case Place::kWriting:
      return "being written";
    case Place::kUsed:
      return "a chunk's";
    case Place::kFreeOnRelease:
      return "waiting for its readers";
    case Place::kHeldBack:
      return "held back";
  }
  return "?";
}

SsdCatalog::SsdCatalog(uint64_t capacity_slots, uint64_t slot_bytes,
                       std::shared_ptr<std::atomic<uint64_t>> sequence)
    : capacity_(capacity_slots),
      slot_bytes_(slot_bytes),
      sequence_(sequence ? std::move(sequence) : std::make_shared<std::atomic<uint64_t>>(1)) {}

void SsdCatalog::PushFree(uint64_t slot) {
  free_.push_back(slot);
  std::push_heap(free_.begin(), free_.end(), std::greater<>());
}

std::optional<uint64_t> SsdCatalog::TakeFree() {
  if (!free_.empty()) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<>());
    const uint64_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  if (place_.size() >= capacity_) return std::nullopt;
  place_.push_back(Place::kFree);  // the lowest never used
  return place_.size() - 1;
}

void SsdCatalog::Move(uint64_t slot, std::initializer_list<Place> from, Place to) {
  KVC_CHECK(slot < place_.size()) << "SSD slot " << slot << " was never taken (" << place_.size()
                                  << " have been, of " << capacity_ << ")";
  const Place at = place_[slot];
  KVC_CHECK(std::find(from.begin(), from.end(), at) != from.end())
      << "SSD slot " << slot << " is " << PlaceName(at) << ", cannot become " << PlaceName(to);
  used_ += (to == Place::kUsed) - (at == Place::kUsed);
  place_[slot] = to;
}

void SsdCatalog::RaiseSequence(uint64_t at_least) {
  uint64_t now = sequence_->load();
  while (now < at_least && !sequence_->compare_exchange_weak(now, at_least)) {
  }
}

void SsdCatalog::Load(const std::vector<bool>& used, std::optional<uint64_t> named_next) {
  MutexLock lk(mu_);
  KVC_CHECK(used.size() <= capacity_ && readers_.empty() && in_flight_ == 0 && !record_busy_);
  KVC_CHECK(!named_next ||
            (*named_next < capacity_ && (*named_next >= used.size() || !used[*named_next])));
  free_.clear();
  reserved_.clear();
  reserved_free_.clear();
  held_back_ = 0;
  used_ = 0;
  named_next_ = named_next;
  // Slots past the last used (or named) one stay untaken: a tier of millions of slots
  // costs what it holds.
  const uint64_t known = std::max<uint64_t>(used.size(), named_next ? *named_next + 1 : 0);
  place_.assign(known, Place::kFree);
  for (uint64_t s = known; s-- > 0;) {
    if (s < used.size() && used[s]) {
      place_[s] = Place::kUsed;
      ++used_;
    } else if (s == named_next) {
      place_[s] = Place::kNamedNext;
    } else {
      place_[s] = Place::kFree;
      free_.push_back(s);
    }
  }
  std::make_heap(free_.begin(), free_.end(), std::greater<>());
}

uint64_t SsdCatalog::TakeSequence() { return sequence_->fetch_add(1); }

uint64_t SsdCatalog::next_sequence() const { return sequence_->load(); }

size_t SsdCatalog::reserved_free() const {
  MutexLock lk(mu_);
  return reserved_free_.size();
}

std::optional<uint64_t> SsdCatalog::TakeForWrite() {
  MutexLock lk(mu_);
  KVC_CHECK(!record_busy_) << "a write took a slot while the reservation's record changes";
  if (reserved_free_.empty()) return std::nullopt;
  const uint64_t slot = reserved_free_.back();
  reserved_free_.pop_back();
  KVC_CHECK(reserved_.contains(slot)) << "SSD slot " << slot << " is written outside the "
                                      << "reservation";
  Move(slot, {Place::kReservedFree}, Place::kWriting);
  ++in_flight_;
  return slot;
}

void SsdCatalog::Published(uint64_t slot) {
  MutexLock lk(mu_);
  Move(slot, {Place::kWriting}, Place::kUsed);
}

bool SsdCatalog::EndWrites(size_t n) {
  MutexLock lk(mu_);
  KVC_CHECK(n <= in_flight_) << n << " writes ended of " << in_flight_ << " in flight";
  in_flight_ -= n;
  return in_flight_ == 0;
}

size_t SsdCatalog::in_flight() const {
  MutexLock lk(mu_);
  return in_flight_;
}

void SsdCatalog::BeginRead(uint64_t slot) {
  MutexLock lk(mu_);
  KVC_CHECK(slot < place_.size() && place_[slot] == Place::kUsed)
      << "a read of SSD slot " << slot << ", which is "
      << (slot < place_.size() ? PlaceName(place_[slot]) : "never taken");
  ++readers_[slot];
}

void SsdCatalog::EndRead(uint64_t slot) {
  MutexLock lk(mu_);
  auto it = readers_.find(slot);
  KVC_CHECK(it != readers_.end()) << "a read of SSD slot " << slot << " ended that never began";
  if (--it->second > 0) return;
  readers_.erase(it);
  if (place_[slot] == Place::kFreeOnRelease) ReturnFree(slot);
}

void SsdCatalog::ReturnFree(uint64_t slot) {
  if (reserved_.contains(slot)) {
    place_[slot] = Place::kReservedFree;
    reserved_free_.push_back(slot);
  } else {
    place_[slot] = Place::kFree;
    PushFree(slot);
  }
}

void SsdCatalog::Free(uint64_t slot) {
  MutexLock lk(mu_);
  if (readers_.contains(slot)) {
    Move(slot, {Place::kUsed, Place::kWriting}, Place::kFreeOnRelease);
    return;
  }
  Move(slot, {Place::kUsed, Place::kWriting}, Place::kFree);
  ReturnFree(slot);
}

void SsdCatalog::HoldBack(uint64_t slot) {
  MutexLock lk(mu_);
  Move(slot, {Place::kUsed}, Place::kHeldBack);
  ++held_back_;
}

bool SsdCatalog::record_busy() const {
  MutexLock lk(mu_);
  return record_busy_;
}

size_t SsdCatalog::Obtainable() const {
  MutexLock lk(mu_);
  return free_.size() + (capacity_ - place_.size()) + (named_next_ ? 1 : 0);
}

std::optional<uint64_t> SsdCatalog::TrimFree() {
  MutexLock lk(mu_);
  uint64_t keep = place_.size();
  while (keep > 0 && place_[keep - 1] == Place::kFree) --keep;
  if (keep == place_.size()) return std::nullopt;
  place_.resize(keep);
  std::erase_if(free_, [&](uint64_t slot) { return slot >= keep; });
  std::make_heap(free_.begin(), free_.end(), std::greater<>());
  return keep;
}

std::optional<SlotReservation> SsdCatalog::PlanRenameIfEmpty() {
  MutexLock lk(mu_);
  if (record_busy_ || in_flight_ != 0 || used_ != 0 || !reserved_free_.empty() || !named_next_ ||
      free_.empty() || free_.front() > *named_next_)
    return std::nullopt;
  renaming_ = TakeFree();
  Move(*renaming_, {Place::kFree}, Place::kReserving);
  record_busy_ = true;
  return ListedNow(renaming_);
}

void SsdCatalog::FinishRename(bool committed) {
  MutexLock lk(mu_);
  KVC_CHECK(record_busy_ && renaming_);
  if (committed) {
    place_[*named_next_] = Place::kFree;
    PushFree(*named_next_);
    place_[*renaming_] = Place::kNamedNext;
    named_next_ = renaming_;
  } else {
    place_[*renaming_] = Place::kFree;
    PushFree(*renaming_);
  }
  renaming_.reset();
  record_busy_ = false;
}

uint64_t SsdCatalog::Used() const {
  MutexLock lk(mu_);
  return used_;
}

uint64_t SsdCatalog::Taken() const {
  MutexLock lk(mu_);
  return place_.size() - free_.size() - (named_next_ ? 1 : 0);
}

namespace {
// At most this many bytes of slots a reservation takes ahead, or eviction frees ahead, in
// one class: the other classes share the device budget.
constexpr uint64_t kReserveAheadBytes = 128ull << 20;
constexpr uint64_t kEvictAheadBytes = 32ull << 20;
uint64_t SlotsIn(uint64_t bytes, uint64_t slot_bytes) {
  return slot_bytes == 0 ? bytes : std::max<uint64_t>(1, bytes / slot_bytes);
}
}  // namespace

size_t SsdCatalog::ReserveAhead() const {
  return std::clamp<size_t>(capacity_ / 8, 1,
                            std::min<uint64_t>(1024, SlotsIn(kReserveAheadBytes, slot_bytes_)));
}

size_t SsdCatalog::EvictAhead() const {
  return std::min<size_t>(capacity_ / 64,
                          std::min<uint64_t>(32, SlotsIn(kEvictAheadBytes, slot_bytes_)));
}

void SsdCatalog::BeginReservation() {
  MutexLock lk(mu_);
  KVC_CHECK(!record_busy_ && !plan_);
  record_busy_ = true;
}

SlotReservation SsdCatalog::PlanReservation(size_t missing, size_t limit) {
  MutexLock lk(mu_);
  KVC_CHECK(record_busy_ && in_flight_ == 0 && !plan_);
  Plan plan;
  const size_t named = named_next_ ? 1 : 0;
  const size_t available =
      std::min<size_t>(free_.size() + (capacity_ - place_.size()) + named, std::max(limit, named));
  size_t take = std::min(available, std::max(missing, ReserveAhead()));
  if (take == available && take > missing) --take;
  // Writes take reserved_free_ from its back: the leftovers of the last reservation first
  // (listed in its record), then the named slot, so that the first write outside the last
  // record's slots lands on the slot it named. A named slot is always taken, even when
  // nothing is missing any more (the slots freed while this one waited for the writes in
  // flight made up for it): it is named by the record being replaced, and nowhere else.
  const size_t from_free = take - std::min(take, named);
  for (size_t i = 0; i < from_free; ++i) plan.fresh.push_back(*TakeFree());
  std::reverse(plan.fresh.begin(), plan.fresh.end());  // the first taken is written first
  if (named != 0) {
    plan.fresh.push_back(*named_next_);
    plan.took_named = true;
  }
  for (uint64_t s : plan.fresh) Move(s, {Place::kFree, Place::kNamedNext}, Place::kReserving);
  plan.following = TakeFree();
  if (plan.following) Move(*plan.following, {Place::kFree}, Place::kReserving);
  plan.record.min_sequence = plan.record.sequence_bound = sequence_->load();
  plan.record.slots = reserved_free_;
  plan.record.slots.insert(plan.record.slots.end(), plan.fresh.begin(), plan.fresh.end());
  plan.record.next_first_slot = plan.following;
  SlotReservation record = plan.record;
  plan_ = std::move(plan);
  return record;
}

void SsdCatalog::FinishReservation(bool committed) {
  MutexLock lk(mu_);
  KVC_CHECK(record_busy_ && plan_);
  Plan& plan = *plan_;
  if (committed) {
    reserved_ = {plan.record.slots.begin(), plan.record.slots.end()};
    min_sequence_ = plan.record.min_sequence;
    // A slot freed while the record was committed (a chunk of the old listing evicted for
    // another class, or its last reader gone) went back among the old reservation's free
    // slots; the new record does not list it, so it is plainly free now.
    std::erase_if(reserved_free_, [&](uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (reserved_.contains(slot)) return false;
      place_[slot] = Place::kFree;
      PushFree(slot);
      return true;
    });
    // Lowest slot on top, as in free_: slabs fill in order.
    for (uint64_t s : plan.fresh) place_[s] = Place::kReservedFree;
    reserved_free_.insert(reserved_free_.begin(), plan.fresh.begin(), plan.fresh.end());
    named_next_ = plan.following;
    if (plan.following) place_[*plan.following] = Place::kNamedNext;
  } else {
    // As before: the slot named stays named, the rest goes back to the free list.
    if (plan.following) {
      place_[*plan.following] = Place::kFree;
      PushFree(*plan.following);
    }
    if (plan.took_named) {
      place_[plan.fresh.back()] = Place::kNamedNext;
      plan.fresh.pop_back();
    }
    for (uint64_t s : plan.fresh) place_[s] = Place::kFree;
    for (uint64_t s : plan.fresh) PushFree(s);
  }
  plan_.reset();
  record_busy_ = false;
}

std::optional<SlotReservation> SsdCatalog::PlanRemoval(std::span<const uint64_t> slots) {
  MutexLock lk(mu_);
  KVC_CHECK(!record_busy_);
  bool any_reserved = false;
  for (uint64_t slot : slots) any_reserved |= reserved_.erase(slot) > 0;
  if (!any_reserved) return std::nullopt;
  record_busy_ = true;
  return ListedNow(named_next_);
}

SlotReservation SsdCatalog::ListedNow(std::optional<uint64_t> named) const {
  return SlotReservation{
      min_sequence_, {reserved_.begin(), reserved_.end()}, sequence_->load(), named};
}

std::optional<SlotReservation> SsdCatalog::PlanRelease() {
  MutexLock lk(mu_);
  KVC_CHECK(!record_busy_ && releasing_.empty());
  if (reserved_free_.empty()) return std::nullopt;
  releasing_.swap(reserved_free_);
  for (uint64_t slot : releasing_) {
    reserved_.erase(slot);
    Move(slot, {Place::kReservedFree}, Place::kReserving);
  }
  record_busy_ = true;
  return ListedNow(named_next_);
}

void SsdCatalog::FinishRelease(bool committed) {
  MutexLock lk(mu_);
  KVC_CHECK(record_busy_ && !plan_);
  for (uint64_t slot : releasing_) {
    if (committed) {
      place_[slot] = Place::kFree;
      PushFree(slot);
    } else {  // the durable record still lists them: they stay the reservation's
      place_[slot] = Place::kReservedFree;
      reserved_.insert(slot);
      reserved_free_.push_back(slot);
    }
  }
  releasing_.clear();
  record_busy_ = false;
}

size_t SsdCatalog::releasing() const {
  MutexLock lk(mu_);
  return releasing_.size();
}

void SsdCatalog::FinishRemoval() {
  MutexLock lk(mu_);
  KVC_CHECK(record_busy_ && !plan_);
  record_busy_ = false;
}

std::string SsdCatalog::Busy() const {
  MutexLock lk(mu_);
  uint64_t waiting = 0;
  for (Place p : place_) waiting += p == Place::kFreeOnRelease;
  if (in_flight_ == 0 && !record_busy_ && waiting == 0 && readers_.empty()) return "";
  return absl::StrCat(in_flight_, " SSD writes in flight, ", readers_.size(), " slots being read, ",
                      waiting, " slots waiting for readers, reservation ", "commit ",
                      record_busy_ ? "running" : "idle");
}

absl::Status SsdCatalog::CheckInvariants(std::span<const uint64_t> chunk_slots) const {
  MutexLock lk(mu_);
  // Where each list says a slot is; every slot must be claimed by exactly the list its
  // place names (chunks by the store's map).
  std::vector<uint8_t> claimed(place_.size(), 0);
  auto claim = [&](uint64_t slot, Place p, const char* what)
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (slot >= place_.size()) {
      return absl::InternalError(absl::StrCat(what, " names SSD slot ", slot, ", never taken (",
                                              place_.size(), " have been, of ", capacity_, ")"));
    }
    if (claimed[slot]++ != 0 || place_[slot] != p) {
      return absl::InternalError(
          absl::StrCat("SSD slot ", slot, " is ", PlaceName(place_[slot]), " and also in ", what));
    }
    return absl::OkStatus();
  };
  for (uint64_t slot : chunk_slots) {
    if (absl::Status s = claim(slot, Place::kUsed, "a chunk's index entry"); !s.ok()) return s;
  }
  for (uint64_t slot : free_) {
    if (absl::Status s = claim(slot, Place::kFree, "the free list"); !s.ok()) return s;
    if (reserved_.contains(slot)) {
      return absl::InternalError(
          absl::StrCat("SSD slot ", slot, " is on the free list but listed in the reservation"));
    }
  }
  for (uint64_t slot : reserved_free_) {
    if (absl::Status s = claim(slot, Place::kReservedFree, "the reservation's free list"); !s.ok())
      return s;
    if (!reserved_.contains(slot)) {
      return absl::InternalError(
          absl::StrCat("SSD slot ", slot, " is free in the reservation but not listed in it"));
    }
  }
  if (named_next_) {
    if (absl::Status s = claim(*named_next_, Place::kNamedNext, "the reservation's next slot");
        !s.ok())
      return s;
    if (reserved_.contains(*named_next_)) {
      return absl::InternalError(absl::StrCat("SSD slot ", *named_next_,
                                              " is named the next reservation's first but is "
                                              "listed in the current one"));
    }
  }
  uint64_t held_back = 0;
  if (const uint64_t used =
          static_cast<uint64_t>(std::count(place_.begin(), place_.end(), Place::kUsed));
      used != used_) {
    return absl::InternalError(absl::StrCat(used, " SSD slots hold chunks, counted ", used_));
  }
  if (place_.size() > capacity_) {
    return absl::InternalError(
        absl::StrCat(place_.size(), " SSD slots taken of a tier of ", capacity_));
  }
  for (uint64_t slot = 0; slot < place_.size(); ++slot) {
    if (place_[slot] == Place::kHeldBack) {
      ++held_back;
    } else if (claimed[slot] == 0) {
      return absl::InternalError(absl::StrCat("SSD slot ", slot, " is ", PlaceName(place_[slot]),
                                              " but no list or chunk has it: lost"));
    }
  }
  if (held_back != held_back_) {
    return absl::InternalError(
        absl::StrCat(held_back, " SSD slots are held back, counted ", held_back_));
  }
  return absl::OkStatus();
}

}  // namespace kvc::storage
