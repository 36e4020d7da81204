// SsdCatalog on its own: where slots go through the reservation's life (planned,
// committed or not, written, published, read, freed, held back), the rules that keep a
// crash from losing chunks (writes only into listed slots, the named slot first), moves
// that break them aborting, and a random walk of a store's calls checked after each step.
#include "storage/ssd_catalog.h"

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/seed.h"

namespace kvc::storage {
namespace {

std::vector<uint64_t> Slots(const std::set<uint64_t>& s) { return {s.begin(), s.end()}; }

// A catalog of `capacity` slots with `used` holding chunks and the lowest other slot named.
std::unique_ptr<SsdCatalog> Loaded(uint64_t capacity, const std::set<uint64_t>& used,
                                   std::optional<uint64_t>* named = nullptr) {
  auto c = std::make_unique<SsdCatalog>(capacity);
  std::vector<bool> u(capacity, false);
  for (uint64_t s : used) u[s] = true;
  std::optional<uint64_t> first;
  for (uint64_t s = 0; s < capacity && !first; ++s) {
    if (!u[s]) first = s;
  }
  c->Load(u, first);
  if (named != nullptr) *named = first;
  return c;
}

TEST(SsdCatalogTest, AfterLoadEverySlotIsAChunksFreeOrNamed) {
  std::optional<uint64_t> named;
  auto c = Loaded(16, {0, 3, 7}, &named);
  ASSERT_EQ(named, 1u);
  EXPECT_EQ(c->Obtainable(), 13u);  // 12 free + the named one
  EXPECT_EQ(c->reserved_free(), 0u);
  EXPECT_TRUE(c->CheckInvariants(Slots({0, 3, 7})).ok());
  // The store's map must agree: a chunk the catalog does not know, or one missing, is named.
  absl::Status extra = c->CheckInvariants(Slots({0, 3, 7, 9}));
  EXPECT_FALSE(extra.ok());
  EXPECT_NE(extra.message().find("SSD slot 9 is free"), std::string::npos) << extra;
  absl::Status missing = c->CheckInvariants(Slots({0, 3}));
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("SSD slot 7"), std::string::npos) << missing;
}

TEST(SsdCatalogTest, AReservationListsTheNamedSlotAndTheFirstWriteLandsOnIt) {
  std::optional<uint64_t> named;
  auto c = Loaded(64, {0}, &named);
  c->BeginReservation();
  const SlotReservation r = c->PlanReservation(3);
  // ReserveAhead: 64 / 8 = 8 slots, the named one among them; another slot named next.
  EXPECT_EQ(r.slots.size(), 8u);
  EXPECT_NE(std::find(r.slots.begin(), r.slots.end(), *named), r.slots.end());
  ASSERT_TRUE(r.next_first_slot.has_value());
  EXPECT_EQ(std::count(r.slots.begin(), r.slots.end(), *r.next_first_slot), 0);
  EXPECT_EQ(r.min_sequence, c->next_sequence());
  EXPECT_TRUE(c->record_busy());
  c->FinishReservation(true);
  EXPECT_FALSE(c->record_busy());
  EXPECT_EQ(c->reserved_free(), 8u);
  EXPECT_EQ(c->TakeForWrite(), named);  // the slot the last record named
  EXPECT_EQ(c->in_flight(), 1u);
  c->Published(*named);
  EXPECT_TRUE(c->EndWrites(1));
  EXPECT_TRUE(c->CheckInvariants(Slots({0, *named})).ok());
  // The next reservation starts on the slot this one named.
  while (c->reserved_free() > 0) {
    const std::optional<uint64_t> s = c->TakeForWrite();
    c->Free(*s);  // a failed write: back among the reservation's free slots
    c->EndWrites(1);
    if (c->reserved_free() == 7) break;
  }
  EXPECT_TRUE(c->CheckInvariants(Slots({0, *named})).ok());
}

// A size class may grow to the whole device budget: its catalog holds only the slots taken
// so far (lowest first), counts what is taken, and a reservation stops at the room the
// budget gives it.
TEST(SsdCatalogTest, AClassCatalogCostsWhatIsTakenAndAReservationStopsAtTheBudgetsRoom) {
  constexpr uint64_t kCapacity = 1ull << 28;  // a terabyte of 4 KiB slots
  SsdCatalog c(kCapacity, 4096);
  c.Load({}, 0);  // nothing used, slot 0 named
  EXPECT_EQ(c.Obtainable(), kCapacity);
  EXPECT_EQ(c.Taken(), 0u);
  EXPECT_EQ(c.ReserveAhead(), 1024u);
  EXPECT_EQ(c.EvictAhead(), 32u);
  c.BeginReservation();
  const SlotReservation r = c.PlanReservation(3, /*limit=*/5);
  // The budget's room (5), not ReserveAhead, less one kept to name the next first.
  EXPECT_EQ(r.slots, (std::vector<uint64_t>{3, 2, 1, 0})) << "lowest first: the named 0, 1..3";
  EXPECT_EQ(r.next_first_slot, 4u);
  c.FinishReservation(true);
  EXPECT_EQ(c.Taken(), 4u) << "the named slot is not taken";
  EXPECT_EQ(c.TakeForWrite(), 0u);
  c.Published(0);
  c.EndWrites(1);
  EXPECT_TRUE(c.CheckInvariants(Slots({0})).ok());
  c.Free(0);
  EXPECT_EQ(c.Taken(), 4u) << "a listed slot freed stays the reservation's";
  EXPECT_TRUE(c.CheckInvariants({}).ok());
  // Large slots: ahead at most 128 MiB of them.
  EXPECT_EQ(SsdCatalog(kCapacity, 8ull << 20).ReserveAhead(), 16u);
  EXPECT_EQ(SsdCatalog(kCapacity, 8ull << 20).EvictAhead(), 4u);
}

// Another class needs the budget: the reservation's unwritten slots leave it (the record
// keeps the written ones), and come back if that record's commit fails.
TEST(SsdCatalogTest, AReleaseGivesUpTheUnwrittenReservedSlotsOnlyOnceCommitted) {
  std::optional<uint64_t> named;
  auto c = Loaded(64, {0}, &named);
  c->BeginReservation();
  c->PlanReservation(3);
  c->FinishReservation(true);
  ASSERT_EQ(c->reserved_free(), 8u);
  const uint64_t written = *c->TakeForWrite();
  c->Published(written);
  c->EndWrites(1);
  const uint64_t taken = c->Taken();
  for (const bool committed : {false, true}) {
    const std::optional<SlotReservation> r = c->PlanRelease();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->slots, std::vector<uint64_t>{written}) << "only the written slot stays listed";
    EXPECT_EQ(c->releasing(), 7u);
    EXPECT_TRUE(c->record_busy());
    c->FinishRelease(committed);
    EXPECT_FALSE(c->record_busy());
    EXPECT_EQ(c->reserved_free(), committed ? 0u : 7u);
    EXPECT_EQ(c->Taken(), committed ? taken - 7 : taken);
    EXPECT_TRUE(c->CheckInvariants(Slots({0, written})).ok()) << committed;
  }
  EXPECT_FALSE(c->PlanRelease().has_value()) << "nothing left to release";
}

TEST(SsdCatalogTest, AReservationThatIsNotCommittedPutsEverySlotBack) {
  std::optional<uint64_t> named;
  auto c = Loaded(64, {5, 6}, &named);
  const size_t obtainable = c->Obtainable();
  c->BeginReservation();
  c->PlanReservation(10);
  c->FinishReservation(false);
  EXPECT_EQ(c->Obtainable(), obtainable);
  EXPECT_EQ(c->reserved_free(), 0u);
  EXPECT_TRUE(c->CheckInvariants(Slots({5, 6})).ok());
  // And the named slot is still the one a reservation takes first.
  c->BeginReservation();
  const SlotReservation r = c->PlanReservation(1);
  EXPECT_NE(std::find(r.slots.begin(), r.slots.end(), *named), r.slots.end());
  c->FinishReservation(true);
  EXPECT_EQ(c->TakeForWrite(), named);
}

TEST(SsdCatalogTest, AFreedSlotGoesBackWhereItIsListedAndAReadHoldsIt) {
  auto c = Loaded(32, {});
  c->BeginReservation();
  c->PlanReservation(4);
  c->FinishReservation(true);
  const uint64_t listed = *c->TakeForWrite();
  c->Published(listed);
  c->EndWrites(1);
  const size_t reserved_free = c->reserved_free();
  // Read while freed: it waits for the reader, then goes back to the reservation's list.
  c->BeginRead(listed);
  c->Free(listed);
  EXPECT_EQ(c->reserved_free(), reserved_free);
  EXPECT_NE(c->Busy().find("1 slots waiting for readers"), std::string::npos) << c->Busy();
  c->EndRead(listed);
  EXPECT_EQ(c->reserved_free(), reserved_free + 1);
  EXPECT_EQ(c->Busy(), "");
  EXPECT_TRUE(c->CheckInvariants({}).ok());
}

TEST(SsdCatalogTest, ARemovalOfAListedSlotRewritesTheRecordWithoutIt) {
  auto c = Loaded(32, {});
  c->BeginReservation();
  const SlotReservation planned = c->PlanReservation(4);
  c->FinishReservation(true);
  const uint64_t slot = *c->TakeForWrite();
  c->Published(slot);
  c->EndWrites(1);
  std::optional<SlotReservation> record = c->PlanRemoval(std::vector<uint64_t>{slot});
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->slots.size(), planned.slots.size() - 1);
  EXPECT_EQ(std::count(record->slots.begin(), record->slots.end(), slot), 0);
  EXPECT_EQ(record->next_first_slot, planned.next_first_slot);
  EXPECT_TRUE(c->record_busy());
  c->FinishRemoval();
  c->Free(slot);  // no longer listed: to the free list, not the reservation's
  EXPECT_EQ(c->reserved_free(), planned.slots.size() - 1);
  EXPECT_TRUE(c->CheckInvariants({}).ok());
}

TEST(SsdCatalogTest, AHeldBackSlotIsUsedByNobodyUntilTheNextLoad) {
  auto c = Loaded(8, {2, 4});
  const size_t obtainable = c->Obtainable();
  c->HoldBack(4);
  EXPECT_EQ(c->Obtainable(), obtainable);
  EXPECT_TRUE(c->CheckInvariants(Slots({2})).ok());
  EXPECT_FALSE(c->CheckInvariants(Slots({2, 4})).ok());
}

TEST(SsdCatalogDeathTest, MovesThatWouldLoseAChunkAbort) {
  EXPECT_DEATH(
      {
        auto c = Loaded(8, {2});
        c->Free(2);
        c->Free(2);
      },
      "SSD slot 2 is free, cannot become");
  EXPECT_DEATH(
      {
        auto c = Loaded(8, {2});
        c->BeginRead(3);
      },
      "a read of SSD slot 3, which is free");
  EXPECT_DEATH(
      {
        auto c = Loaded(8, {});
        c->BeginReservation();
        c->TakeForWrite();
      },
      "while the reservation's record changes");
  EXPECT_DEATH(
      {
        auto c = Loaded(8, {});
        c->EndRead(1);
      },
      "ended that never began");
}

// A store's calls in random order (fresh seed): reservations committed or not, writes that
// publish or fail, reads, removals through the record or not, failed removals. After each
// step the catalog agrees with the model of which slots hold chunks, and no slot is lost.
TEST(SsdCatalogTest, ARandomWalkOfAStoresCallsKeepsEverySlotAccountedFor) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  const uint64_t capacity = 1 + rng() % 200;
  auto c = Loaded(capacity, {});
  std::set<uint64_t> chunks;
  std::vector<uint64_t> read;  // slots with a read running
  uint64_t held_back = 0;
  for (int step = 0; step < 5000; ++step) {
    switch (rng() % 6) {
      case 0: {  // a reservation
        c->BeginReservation();
        c->PlanReservation(rng() % 4);
        c->FinishReservation(rng() % 4 != 0);
        break;
      }
      case 1: {  // a batch of writes
        std::vector<uint64_t> taken;
        for (int k = rng() % 4; k > 0; --k) {
          if (std::optional<uint64_t> s = c->TakeForWrite()) taken.push_back(*s);
        }
        for (uint64_t s : taken) {
          if (rng() % 5 == 0) {
            c->Free(s);  // the write failed
          } else {
            c->Published(s);
            chunks.insert(s);
          }
        }
        EXPECT_TRUE(c->EndWrites(taken.size()));
        break;
      }
      case 2: {  // a read begins
        if (chunks.empty()) break;
        auto it = chunks.begin();
        std::advance(it, rng() % chunks.size());
        c->BeginRead(*it);
        read.push_back(*it);
        break;
      }
      case 3: {  // a read ends
        if (read.empty()) break;
        const size_t k = rng() % read.size();
        c->EndRead(read[k]);
        read.erase(read.begin() + static_cast<ptrdiff_t>(k));
        break;
      }
      default: {  // a chunk removed: evicted under a reservation, or erased (committed or not)
        if (chunks.empty()) break;
        auto it = chunks.begin();
        std::advance(it, rng() % chunks.size());
        const uint64_t s = *it;
        chunks.erase(it);
        if (rng() % 2 == 0) {
          c->Free(s);
          break;
        }
        const std::optional<SlotReservation> record = c->PlanRemoval(std::vector<uint64_t>{s});
        if (record) c->FinishRemoval();
        if (rng() % 8 == 0) {
          c->HoldBack(s);
          ++held_back;
        } else {
          c->Free(s);
        }
        break;
      }
    }
    if (read.empty()) {
      absl::Status check = c->CheckInvariants(Slots(chunks));
      ASSERT_TRUE(check.ok()) << "step " << step << ", seed " << seed << ": " << check;
    }
  }
  for (uint64_t s : read) c->EndRead(s);
  ASSERT_TRUE(c->CheckInvariants(Slots(chunks)).ok());
  // Nothing is lost: every slot is a chunk's, held back, or obtainable (free, named or
  // among the reservation's free ones).
  EXPECT_EQ(chunks.size() + held_back + c->Obtainable() + c->reserved_free(), capacity)
      << "seed " << seed;
}

}  // namespace
}  // namespace kvc::storage
