#include "storage/fault_injection.h"

#include <cerrno>
#include <cstring>
#include <vector>

namespace kvc::storage {

bool FaultPlan::Draw(uint32_t FaultRates::*rate) {
  MutexLock lock(mu_);
  const uint32_t n = rates_.*rate;
  if (n == 0) return false;
  const bool hit = std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_) == 0;
  if (hit) injected.fetch_add(1);
  return hit;
}

uint64_t FaultPlan::Uniform(uint64_t n) {
  MutexLock lock(mu_);
  return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_);
}

void FaultInjectingIoEngine::Execute(std::span<IoOp> ops, const IoPrepareFn& on_prepare,
                                     const IoDoneFn& on_done) {
  // Each op's fate is drawn up front; the real I/O runs on copies of the ops, changed to
  // match the fate; the caller then sees the (possibly false) reported result.
  enum Fate { kNone, kFailEio, kFailNoSpace, kShortRead, kTorn, kFlipStored, kFlipReturned };
  std::vector<Fate> fate(ops.size(), kNone);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == IoOp::Kind::kRead) {
      if (plan_->Draw(&FaultRates::read_eio))
        fate[i] = kFailEio;
      else if (plan_->Draw(&FaultRates::short_read))
        fate[i] = kShortRead;
      else if (plan_->Draw(&FaultRates::flip_bit_on_read))
        fate[i] = kFlipReturned;
    } else {
      if (plan_->Draw(&FaultRates::write_eio))
        fate[i] = kFailEio;
      else if (plan_->Draw(&FaultRates::write_enospc))
        fate[i] = kFailNoSpace;
      else if (plan_->Draw(&FaultRates::torn_write))
        fate[i] = kTorn;
      else if (plan_->Draw(&FaultRates::flip_bit_on_write))
        fate[i] = kFlipStored;
    }
  }
  auto finish = [&](size_t i, int64_t real_result) {
    IoOp& op = ops[i];
    op.result = real_result;
    switch (fate[i]) {
      case kFailEio:
        op.result = -EIO;
        break;
      case kFailNoSpace:
        op.result = -ENOSPC;
        break;
      case kTorn:
        if (op.result >= 0) op.result = op.len;  // the lie: reported complete
        break;
      case kFlipReturned:
        if (op.result > 0) op.buf[plan_->Uniform(static_cast<uint64_t>(op.result))] ^= 0x10;
        break;
      default:
        break;
    }
    if (on_done) on_done(i);
  };
  std::vector<IoOp> real;
  std::vector<size_t> real_index;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (fate[i] == kFailEio || fate[i] == kFailNoSpace) {
      finish(i, 0);  // never reaches the disk
      continue;
    }
    IoOp op = ops[i];
    if (fate[i] == kTorn) {
      // Only whole 4 KiB sectors reach the disk, as with a real torn O_DIRECT write.
      const uint32_t sectors = op.len / 4096;
      op.len = sectors > 1 ? static_cast<uint32_t>(4096 * plan_->Uniform(sectors)) : 0;
    } else if (fate[i] == kShortRead) {
      op.len = op.len / 2 & ~4095u;
    }
    real.push_back(op);
    real_index.push_back(i);
  }
  // Flipped stores write an aligned copy with one bit changed; the caller's buffer stays
  // intact. The copy is made after the caller staged the op.
  std::vector<std::vector<uint8_t>> copies(real.size());
  base_->Execute(
      real,
      [&](size_t k) {
        const size_t i = real_index[k];
        if (on_prepare) on_prepare(i);
        real[k].buf = ops[i].buf;  // the caller may lend the op its buffer just now
        real[k].buf_index = ops[i].buf_index;
        if (fate[i] != kFlipStored || real[k].len == 0) return;
        copies[k].resize(real[k].len + 4096);
        uint8_t* aligned = reinterpret_cast<uint8_t*>(
            (reinterpret_cast<uintptr_t>(copies[k].data()) + 4095) & ~uintptr_t{4095});
        std::memcpy(aligned, ops[i].buf, real[k].len);
        aligned[plan_->Uniform(real[k].len)] ^= static_cast<uint8_t>(1u << plan_->Uniform(8));
        real[k].buf = aligned;
        real[k].buf_index = -1;
      },
      [&](size_t k) { finish(real_index[k], real[k].result); });
}

absl::Status FaultInjectingIoEngine::Sync(int fd) {
  if (plan_->Draw(&FaultRates::sync_eio)) return absl::InternalError("fdatasync: injected EIO");
  return base_->Sync(fd);
}

}  // namespace kvc::storage
