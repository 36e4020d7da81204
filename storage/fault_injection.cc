#include "storage/fault_injection.h"

#include <cerrno>
#include <cstring>
#include <vector>

namespace kvc::storage {

bool FaultPlan::Draw(uint32_t FaultRates::*rate) {
  std::lock_guard lock(mu_);
  const uint32_t n = rates_.*rate;
  if (n == 0) return false;
  const bool hit = std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_) == 0;
  if (hit) injected.fetch_add(1);
  return hit;
}

uint64_t FaultPlan::Uniform(uint64_t n) {
  std::lock_guard lock(mu_);
  return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_);
}

void FaultInjectingIoEngine::Execute(std::span<IoOp> ops) {
  // Decide each op's fate first, run the real I/O, then apply what happens after it.
  enum Fate { kNone, kFailEio, kFailNoSpace, kShortRead, kTorn, kFlipStored, kFlipReturned };
  std::vector<Fate> fate(ops.size(), kNone);
  std::vector<uint32_t> full_len(ops.size());
  std::vector<std::vector<uint8_t>> flipped_copies(ops.size());
  std::vector<uint8_t*> original_buf(ops.size());
  std::vector<int> original_index(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    IoOp& op = ops[i];
    full_len[i] = op.len;
    original_buf[i] = op.buf;
    original_index[i] = op.buf_index;
    if (op.kind == IoOp::Kind::kRead) {
      if (plan_->Draw(&FaultRates::read_eio)) fate[i] = kFailEio;
      else if (plan_->Draw(&FaultRates::short_read)) fate[i] = kShortRead;
      else if (plan_->Draw(&FaultRates::flip_bit_on_read)) fate[i] = kFlipReturned;
    } else {
      if (plan_->Draw(&FaultRates::write_eio)) fate[i] = kFailEio;
      else if (plan_->Draw(&FaultRates::write_enospc)) fate[i] = kFailNoSpace;
      else if (plan_->Draw(&FaultRates::torn_write)) fate[i] = kTorn;
      else if (plan_->Draw(&FaultRates::flip_bit_on_write)) fate[i] = kFlipStored;
    }
    if (fate[i] == kTorn) {
      // Only whole 4 KiB sectors reach the disk, as with a real torn O_DIRECT write.
      const uint32_t sectors = op.len / 4096;
      op.len = sectors > 1 ? static_cast<uint32_t>(4096 * plan_->Uniform(sectors)) : 0;
    } else if (fate[i] == kShortRead) {
      op.len = op.len / 2 & ~4095u;
    } else if (fate[i] == kFlipStored && op.len > 0) {
      // Write a copy with one bit flipped; the caller's buffer stays intact. The copy
      // must stay aligned for O_DIRECT, so it lives in an over-allocated vector.
      flipped_copies[i].resize(op.len + 4096);
      uint8_t* aligned = reinterpret_cast<uint8_t*>(
          (reinterpret_cast<uintptr_t>(flipped_copies[i].data()) + 4095) & ~uintptr_t{4095});
      std::memcpy(aligned, op.buf, op.len);
      aligned[plan_->Uniform(op.len)] ^= static_cast<uint8_t>(1u << plan_->Uniform(8));
      op.buf = aligned;
      op.buf_index = -1;
    }
  }
  // Ops that fail outright never reach the disk.
  std::vector<IoOp> real;
  std::vector<size_t> real_index;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (fate[i] == kFailEio || fate[i] == kFailNoSpace) continue;
    real.push_back(ops[i]);
    real_index.push_back(i);
  }
  base_->Execute(real);
  for (size_t k = 0; k < real.size(); ++k) ops[real_index[k]].result = real[k].result;
  for (size_t i = 0; i < ops.size(); ++i) {
    IoOp& op = ops[i];
    switch (fate[i]) {
      case kFailEio: op.result = -EIO; break;
      case kFailNoSpace: op.result = -ENOSPC; break;
      case kTorn:
        if (op.result >= 0) op.result = full_len[i];  // the lie: reported complete
        break;
      case kFlipReturned:
        if (op.result > 0) op.buf[plan_->Uniform(static_cast<uint64_t>(op.result))] ^= 0x10;
        break;
      default: break;
    }
    op.len = full_len[i];
    op.buf = original_buf[i];
    op.buf_index = original_index[i];
  }
}

absl::Status FaultInjectingIoEngine::Sync(int fd) {
  if (plan_->Draw(&FaultRates::sync_eio)) return absl::InternalError("fdatasync: injected EIO");
  return base_->Sync(fd);
}

}  // namespace kvc::storage
