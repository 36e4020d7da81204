// FaultInjectingIoEngine: wraps a real IoEngine and, per a shared seeded FaultPlan,
// turns some operations into the failures a disk can produce: EIO on read or write,
// ENOSPC on write, short reads, torn writes (only a prefix reaches the disk, success is
// reported), and flipped bits (the disk stores, or returns, one wrong bit). Tests use it
// to check that every fault is a clean error or a miss and that nothing acknowledged is
// lost. Thread-safe: engines in several lanes may share one plan.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>

#include "base/mutex.h"
#include "storage/io_engine.h"

namespace kvc::storage {

struct FaultRates {
  // Each is "1 in N" per operation of that kind; 0 disables it.
  uint32_t read_eio = 0;
  uint32_t write_eio = 0;
  uint32_t write_enospc = 0;
  uint32_t short_read = 0;
  uint32_t torn_write = 0;
  uint32_t flip_bit_on_write = 0;  // the stored bytes differ from what was given
  uint32_t flip_bit_on_read = 0;   // the returned bytes differ from what is stored
  uint32_t sync_eio = 0;
  uint32_t new_slab_sync_eio = 0;  // the fsync that makes a new slab file durable
};

class FaultPlan {
 public:
  explicit FaultPlan(uint64_t seed) : rng_(seed) {}
  void set_rates(const FaultRates& r) {
    MutexLock lock(mu_);
    rates_ = r;
  }
  // Draws "1 in n" (false when n == 0).
  bool Draw(uint32_t FaultRates::*rate);
  uint64_t Uniform(uint64_t n);  // [0, n)
  std::atomic<uint64_t> injected{0};

 private:
  Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  FaultRates rates_ ABSL_GUARDED_BY(mu_);
};

class FaultInjectingIoEngine final : public IoEngine {
 public:
  FaultInjectingIoEngine(std::unique_ptr<IoEngine> base, std::shared_ptr<FaultPlan> plan)
      : base_(std::move(base)), plan_(std::move(plan)) {}
  const char* name() const override { return "fault-injecting"; }
  absl::Status RegisterBuffers(std::span<const iovec> b) override {
    return base_->RegisterBuffers(b);
  }
  void Execute(std::span<IoOp> ops, const IoPrepareFn& on_prepare,
               const IoDoneFn& on_done) override;
  absl::Status Sync(int fd) override;

 private:
  std::unique_ptr<IoEngine> base_;
  std::shared_ptr<FaultPlan> plan_;
};

}  // namespace kvc::storage
