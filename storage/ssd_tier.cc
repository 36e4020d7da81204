#include "storage/ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/status_macros.h"

namespace kvc::storage {
namespace {

uint32_t IoBytes(uint32_t header_bytes, uint32_t payload_bytes) {
  return static_cast<uint32_t>((header_bytes + payload_bytes + kSlotAlignment - 1) /
                               kSlotAlignment * kSlotAlignment);
}

std::string SlabPath(const std::string& dir, uint64_t slab) {
  return absl::StrFormat("%s/slab-%06d.dat", dir, slab);
}

absl::Status IoError(const char* what, uint64_t slot, int64_t result, uint32_t want) {
  if (result >= 0) {
    return absl::InternalError(
        absl::StrCat("short ", what, " of slot ", slot, ": ", result, " of ", want, " bytes"));
  }
  const int err = static_cast<int>(-result);
  const std::string msg = absl::StrCat(what, " of slot ", slot, ": ", strerror(err));
  return err == ENOSPC ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}

// Writes zeros over [from, to) of a slab and syncs it. fallocate would leave "unwritten"
// extents, and the first write into one turns every later fdatasync into a journal
// commit; writing the blocks once up front keeps a durable put to a data flush. Bytes
// before `from` (slots already in use) are never touched.
absl::Status ZeroFill(int fd, off_t from, off_t bytes) {
  constexpr size_t kBlock = 4 << 20;
  void* zeros = std::aligned_alloc(kSlotAlignment, kBlock);
  if (zeros == nullptr) return absl::ResourceExhaustedError("no memory for zero fill");
  std::memset(zeros, 0, kBlock);
  absl::Status status;
  for (off_t at = from / kSlotAlignment * kSlotAlignment; at < bytes && status.ok();) {
    const size_t n = static_cast<size_t>(std::min<off_t>(kBlock, bytes - at));
    const ssize_t w = pwrite(fd, zeros, n, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      status = err == ENOSPC ? absl::ResourceExhaustedError(strerror(err))
                             : absl::InternalError(strerror(err));
    } else {
      at += w;
    }
  }
  std::free(zeros);
  if (status.ok() && fdatasync(fd) != 0)
    status = absl::InternalError(absl::StrCat("fdatasync: ", strerror(errno)));
  return status;
}

// The I/O of a batch: one op per entry `op_for` accepts; `which[k]` is the entry of ops[k].
// An entry it refuses (bad size, slot out of range) gets the refusal as its status.
struct BatchOps {
  std::vector<IoOp> ops;
  std::vector<size_t> which;
};
template <typename OpFor>  // absl::StatusOr<IoOp>(size_t entry)
BatchOps PlanBatch(size_t entries, std::vector<absl::Status>& status, OpFor op_for) {
  BatchOps batch;
  for (size_t i = 0; i < entries; ++i) {
    absl::StatusOr<IoOp> op = op_for(i);
    if (!op.ok()) {
      status[i] = op.status();
      continue;
    }
    batch.ops.push_back(*op);
    batch.which.push_back(i);
  }
  return batch;
}

// A lane's staging buffers, lent to ops as they go out and taken back as they complete.
// An engine keeps at most its queue depth of ops between the two (IoPrepareFn), so one
// Execute over a batch of any length keeps the disk's queue full to the end, instead of
// draining it every queue_depth ops.
class StagingLoans {
 public:
  StagingLoans(uint8_t* staging, uint64_t slot_bytes, unsigned buffers, size_t ops)
      : staging_(staging), slot_bytes_(slot_bytes), lent_(ops, -1) {
    for (unsigned b = buffers; b-- > 0;) free_.push_back(static_cast<int>(b));
  }
  void Lend(size_t k, IoOp& op) {
    KVC_CHECK(!free_.empty()) << "an engine has more ops in flight than its queue depth";
    const int b = free_.back();
    free_.pop_back();
    lent_[k] = b;
    op.buf = staging_ + static_cast<uint64_t>(b) * slot_bytes_;
    op.buf_index = b;
  }
  void TakeBack(size_t k) {
    if (lent_[k] < 0) return;  // failed before it was prepared
    free_.push_back(std::exchange(lent_[k], -1));
  }

 private:
  uint8_t* staging_;
  uint64_t slot_bytes_;
  std::vector<int> free_;
  std::vector<int> lent_;  // per op: its buffer, -1 while it holds none
};

}  // namespace

// Returns the lane to the pool when it goes out of scope.
class SsdTier::LaneLease {
 public:
  explicit LaneLease(SsdTier* t) : tier_(t), lane_(t->AcquireLane()) {}
  ~LaneLease() { tier_->ReleaseLane(lane_); }
  Lane* operator->() const { return lane_; }
  Lane& operator*() const { return *lane_; }

 private:
  SsdTier* tier_;
  Lane* lane_;
};

absl::StatusOr<std::unique_ptr<SsdTier>> SsdTier::Open(const SsdTierOptions& options) {
  if (options.slot_bytes == 0 || options.slot_bytes % kSlotAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot size ", options.slot_bytes, " is not a positive multiple of 4096"));
  }
  if (SlotHeaderBytes(options.slot_format) == 0 ||
      SlotHeaderBytes(options.slot_format) >= options.slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("slot format ", options.slot_format));
  }
  if (options.queue_depth == 0 || options.lanes == 0 || options.slots_per_slab == 0) {
    return absl::InvalidArgumentError("queue depth, lanes and slots per slab must be positive");
  }
  SsdTierOptions o = options;
  const uint64_t per_depth = uint64_t{o.lanes} * o.slot_bytes;
  o.queue_depth =
      static_cast<unsigned>(std::clamp<uint64_t>(o.staging_bytes / per_depth, 1, o.queue_depth));
  std::unique_ptr<SsdTier> tier(new SsdTier(o));
  KVC_RETURN_IF_ERROR(tier->Init());
  return tier;
}

absl::Status SsdTier::Init() {
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create SSD folder ", options_.dir, ": ", ec.message()));
  }
  const uint64_t slabs =
      (options_.capacity_slots + options_.slots_per_slab - 1) / options_.slots_per_slab;
  slab_count_ = slabs;
  {
    MutexLock lock(slabs_mu_);
    slab_fds_.assign(slabs, -1);
    slab_creating_.assign(slabs, false);
  }

  for (unsigned i = 0; i < options_.lanes; ++i) {
    auto lane = std::make_unique<Lane>();
    if (options_.backend != IoBackend::kPosix) {
      absl::StatusOr<std::unique_ptr<IoEngine>> uring = MakeUringIoEngine(options_.queue_depth);
      if (uring.ok()) {
        lane->engine = *std::move(uring);
        backend_name_ = "io_uring";
      } else if (options_.backend == IoBackend::kUring) {
        return uring.status();
      } else {
        fallback_reason_ = std::string(uring.status().message());
      }
    }
    if (!lane->engine) {
      lane->engine = MakePosixIoEngine();
      backend_name_ = "posix";
    }
    if (options_.faults) {
      lane->engine =
          std::make_unique<FaultInjectingIoEngine>(std::move(lane->engine), options_.faults);
    }
    if (options_.power_cut)
      lane->engine = options_.power_cut->WrapIoEngine(std::move(lane->engine));
    const size_t bytes = options_.queue_depth * options_.slot_bytes;
    lane->staging = static_cast<uint8_t*>(std::aligned_alloc(kSlotAlignment, bytes));
    if (lane->staging == nullptr)
      return absl::ResourceExhaustedError("cannot allocate staging buffers");
    std::vector<iovec> iov(options_.queue_depth);
    for (unsigned b = 0; b < options_.queue_depth; ++b) {
      iov[b] = {lane->staging + b * options_.slot_bytes, options_.slot_bytes};
    }
    KVC_RETURN_IF_ERROR(lane->engine->RegisterBuffers(iov));
    {
      MutexLock lock(lanes_mu_);
      idle_lanes_.push_back(lane.get());
    }
    lanes_.push_back(std::move(lane));
  }
  if (options_.lay_out_ahead) preallocator_ = std::thread([this] { LayOutAheadLoop(); });
  return absl::OkStatus();
}

void SsdTier::LayOutAheadLoop() {
  uint64_t next = 0;
  MutexLock lock(slabs_mu_);
  while (!stopping_) {
    next = std::min(next, lay_out_to_);  // slabs given back are laid out again when wanted
    if (next >= lay_out_to_) {
      lay_out_wanted_.wait(slabs_mu_);
      continue;
    }
    const uint64_t slab = next++;
    if (slab_fds_[slab] >= 0) continue;
    lock.unlock();
    (void)SlabFd(slab, /*in_use=*/false);  // an error is the next write's to meet (and report)
    lock.lock();
  }
}

SsdTier::~SsdTier() {
  {
    MutexLock lock(slabs_mu_);
    stopping_ = true;
  }
  lay_out_wanted_.notify_all();
  if (preallocator_.joinable()) preallocator_.join();
  for (auto& lane : lanes_) {
    lane->engine.reset();
    std::free(lane->staging);
  }
  for (int fd : slab_fds_) {
    if (fd >= 0) close(fd);
  }
}

absl::StatusOr<int> SsdTier::SlabFd(uint64_t slab, bool in_use) {
  if (slab >= slab_count_) {
    return absl::OutOfRangeError(absl::StrCat("slab ", slab, " beyond capacity"));
  }
  // Laying out a slab takes a while (zero fill): do it without the lock, so I/O to the
  // other slabs goes on; callers that need this slab wait for it.
  MutexLock lock(slabs_mu_);
  // (Only a slab used for I/O asks for the next: the layout's own calls would chain on to
  // the whole capacity.)
  if (in_use && options_.lay_out_ahead && slab + 1 < slab_count_ && lay_out_to_ < slab + 2) {
    lay_out_to_ = slab + 2;  // this slab and the next
    lay_out_wanted_.notify_all();
  }
  while (slab_creating_[slab]) slab_ready_.wait(slabs_mu_);
  if (slab_fds_[slab] >= 0) return slab_fds_[slab];
  slab_creating_[slab] = true;
  lock.unlock();
  absl::StatusOr<int> fd = CreateSlab(slab);
  lock.lock();
  slab_creating_[slab] = false;
  if (fd.ok()) slab_fds_[slab] = *fd;
  slab_ready_.notify_all();
  return fd;
}

absl::Status SsdTier::SyncNewFile(int fd, const std::string& path) {
  if (options_.faults && options_.faults->Draw(&FaultRates::new_slab_sync_eio)) {
    ++options_.faults->injected;
    return absl::InternalError(absl::StrCat("fsync ", path, ": injected EIO"));
  }
  if (fsync(fd) != 0)
    return absl::InternalError(absl::StrCat("fsync ", path, ": ", strerror(errno)));
  const int dir = open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0)
    return absl::InternalError(absl::StrCat("open ", options_.dir, ": ", strerror(errno)));
  const int rc = fsync(dir);
  const int err = errno;
  close(dir);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("fsync ", options_.dir, ": ", strerror(err)));
  return absl::OkStatus();
}

absl::StatusOr<int> SsdTier::CreateSlab(uint64_t slab) {
  const std::string path = SlabPath(options_.dir, slab);
  const bool existed = access(path.c_str(), F_OK) == 0;
  int flags = O_RDWR | O_CREAT | O_CLOEXEC;
  int fd = direct_io_ ? open(path.c_str(), flags | O_DIRECT, 0600) : -1;
  if (fd < 0 && (!direct_io_ || errno == EINVAL)) {
    direct_io_ = false;  // e.g. tmpfs: no O_DIRECT, the page cache it is
    fd = open(path.c_str(), flags, 0600);
  }
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", strerror(errno)));
  // The last slab holds only the slots the capacity reaches; it grows if capacity does.
  const uint64_t slots =
      std::min(options_.slots_per_slab, options_.capacity_slots - slab * options_.slots_per_slab);
  const off_t bytes = static_cast<off_t>(slots * options_.slot_bytes);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("stat ", path, ": ", strerror(err)));
  }
  if (st.st_size < bytes) {
    if (absl::Status s = ZeroFill(fd, st.st_size, bytes); !s.ok()) {
      close(fd);
      return absl::Status(s.code(), absl::StrCat("preallocate ", path, ": ", s.message()));
    }
  }
  if (!existed) {
    // The new file's directory entry must be durable before any chunk in it is indexed:
    // a sync that fails fails the slab, and so every write waiting for it.
    absl::Status synced = SyncNewFile(fd, path);
    if (!synced.ok()) {
      close(fd);
      unlink(path.c_str());  // laid out again by the next write that needs it
      return synced;
    }
  }
  return fd;
}

absl::StatusOr<IoOp> SsdTier::SlotOp(IoOp::Kind kind, uint64_t slot, uint32_t payload_bytes,
                                     const Lane& lane, int staging_index) {
  KVC_ASSIGN_OR_RETURN(int fd, SlabFd(slot / options_.slots_per_slab));
  return IoOp{kind,
              fd,
              (slot % options_.slots_per_slab) * options_.slot_bytes,
              staging_index < 0
                  ? nullptr
                  : lane.staging + static_cast<uint64_t>(staging_index) * options_.slot_bytes,
              IoBytes(header_bytes(), payload_bytes),
              staging_index,
              0};
}

bool SsdTier::SlabOnDisk(uint64_t slab) {
  {
    if (slab >= slab_count_) return false;
    MutexLock lock(slabs_mu_);
    if (slab_fds_[slab] >= 0) return true;
  }
  return access(SlabPath(options_.dir, slab).c_str(), F_OK) == 0;
}

absl::Status SsdTier::RemoveSlabsFrom(uint64_t first) {
  // The slab files there are (a class may span thousands of slabs, few of them on disk).
  std::vector<uint64_t> on_disk;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.dir, ec)) {
    const std::string name = entry.path().filename().string();
    unsigned long long n = 0;
    if (std::sscanf(name.c_str(), "slab-%llu.dat", &n) == 1 && n >= first && n < slab_count_)
      on_disk.push_back(n);
  }
  absl::Status status;
  MutexLock lock(slabs_mu_);
  for (uint64_t slab : on_disk) {
    while (slab_creating_[slab]) slab_ready_.wait(slabs_mu_);
    if (slab_fds_[slab] >= 0) {
      close(slab_fds_[slab]);
      slab_fds_[slab] = -1;
    }
    const std::string path = SlabPath(options_.dir, slab);
    if (unlink(path.c_str()) != 0 && errno != ENOENT && status.ok())
      status = absl::InternalError(absl::StrCat("unlink ", path, ": ", strerror(errno)));
  }
  lay_out_to_ = std::min(lay_out_to_, first);
  return status;
}

uint64_t SsdTier::LaidOutSlots() {
  for (uint64_t slab = slab_count_; slab-- > 0;) {
    if (SlabOnDisk(slab))
      return std::min(options_.capacity_slots, (slab + 1) * options_.slots_per_slab);
  }
  return 0;
}

absl::Status SsdTier::PreallocateAll() {
  for (uint64_t slab = 0; slab < slab_count_; ++slab) {
    if (absl::StatusOr<int> fd = SlabFd(slab, /*in_use=*/false); !fd.ok()) return fd.status();
  }
  return absl::OkStatus();
}

SsdTier::Lane* SsdTier::AcquireLane() {
  MutexLock lock(lanes_mu_);
  while (idle_lanes_.empty()) lane_free_.wait(lanes_mu_);
  Lane* lane = idle_lanes_.back();
  idle_lanes_.pop_back();
  return lane;
}

void SsdTier::ReleaseLane(Lane* lane) {
  {
    MutexLock lock(lanes_mu_);
    idle_lanes_.push_back(lane);
  }
  lane_free_.notify_one();
}

std::vector<absl::Status> SsdTier::Write(std::span<SlotWrite> writes) {
  std::vector<absl::Status> status(writes.size());
  const uint32_t header = header_bytes();
  const uint64_t max_payload = options_.slot_bytes - header;
  LaneLease lane(this);
  BatchOps batch = PlanBatch(writes.size(), status, [&](size_t i) -> absl::StatusOr<IoOp> {
    const SlotWrite& w = writes[i];
    if (w.payload.size() > max_payload || w.payload.size() != w.header.payload_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "payload of ", w.payload.size(), " bytes does not fit a slot of ", options_.slot_bytes));
    }
    return SlotOp(IoOp::Kind::kWrite, w.slot, w.header.payload_bytes, *lane, kLentLater);
  });
  // (References, not a structured binding: the lambdas below capture them, which the
  // clang of scripts/lock-check.sh refuses for a binding.)
  std::vector<IoOp>& ops = batch.ops;
  const std::vector<size_t>& which = batch.which;
  // Stage each slot just before its write goes out, in a staging buffer lent to it until it
  // completes: header, payload, zero tail, and the payload checksum computed from the staged
  // copy block by block as it is copied.
  StagingLoans loans(lane->staging, options_.slot_bytes, options_.queue_depth, ops.size());
  lane->engine->Execute(
      ops,
      [&](size_t k) {
        loans.Lend(k, ops[k]);
        SlotWrite& w = writes[which[k]];
        uint8_t* buf = ops[k].buf;
        w.header.payload_checksum = w.payload.CopyWithChecksum(buf + header);
        std::memset(buf + header + w.payload.size(), 0, ops[k].len - header - w.payload.size());
        EncodeSlotHeader(w.header, buf, options_.slot_format);
      },
      [&](size_t k) { loans.TakeBack(k); });
  for (size_t k = 0; k < ops.size(); ++k) {
    if (ops[k].result != ops[k].len) {
      status[which[k]] = IoError("write", writes[which[k]].slot, ops[k].result, ops[k].len);
    }
  }
  return status;
}

absl::Status SsdTier::SyncSlabs(const std::set<uint64_t>& slabs) {
  LaneLease lane(this);
  for (uint64_t slab : slabs) {
    KVC_ASSIGN_OR_RETURN(int fd, SlabFd(slab));
    KVC_RETURN_IF_ERROR(lane->engine->Sync(fd));
  }
  return absl::OkStatus();
}

std::vector<absl::Status> SsdTier::Read(std::span<SlotRead> reads) {
  std::vector<absl::Status> status(reads.size());
  const uint64_t max_payload = options_.slot_bytes - header_bytes();
  LaneLease lane(this);
  BatchOps batch = PlanBatch(reads.size(), status, [&](size_t i) -> absl::StatusOr<IoOp> {
    const SlotRead& r = reads[i];
    if (r.expected.payload_bytes > max_payload || r.out.size() != r.expected.payload_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("read of ", r.expected.payload_bytes,
                                                     " bytes into a buffer of ", r.out.size()));
    }
    absl::StatusOr<IoOp> op =
        SlotOp(IoOp::Kind::kRead, r.slot, r.expected.payload_bytes, *lane, kLentLater);
    if (op.ok() && r.in_place &&
        reinterpret_cast<uintptr_t>(r.out.data() - header_bytes()) % kSlotAlignment == 0) {
      op->buf = r.out.data() - header_bytes();  // the caller's, around its payload
      op->buf_index = -1;                       // (not one of the registered buffers)
    }
    return op;
  });
  std::vector<IoOp>& ops = batch.ops;
  const std::vector<size_t>& which = batch.which;
  // What an op never reported done (its ring failed) answers.
  for (size_t i : which) {
    status[i] =
        absl::UnavailableError(absl::StrCat("read of slot ", reads[i].slot, " did not complete"));
  }
  // A slot is read into a staging buffer lent to it until it is verified and copied out
  // (which happens as it lands, while the rest of the batch is in flight), or straight into
  // the caller's buffer and verified there.
  StagingLoans loans(lane->staging, options_.slot_bytes, options_.queue_depth, ops.size());
  lane->engine->Execute(
      ops,
      [&](size_t k) {
        if (ops[k].buf == nullptr) loans.Lend(k, ops[k]);  // not read in place
      },
      [&](size_t k) {
        SlotRead& r = reads[which[k]];
        if (ops[k].result != ops[k].len || ops[k].buf == nullptr) {
          status[which[k]] = IoError("read", r.slot, ops[k].result, ops[k].len);
        } else {
          const std::span<const uint8_t> slot(ops[k].buf, ops[k].len);
          uint32_t payload_at = 0;
          status[which[k]] = VerifySlot(r.expected, slot, &payload_at);
          // (In place, the payload is there already unless the slot has another format's
          // header: it is moved within the caller's buffer then.)
          if (status[which[k]].ok() && ops[k].buf + payload_at != r.out.data())
            std::memmove(r.out.data(), ops[k].buf + payload_at, r.out.size());
        }
        loans.TakeBack(k);
      });
  return status;
}

absl::Status SsdTier::Scan(std::span<const uint64_t> slots,
                           const std::function<void(uint64_t, const SlotHeader&)>& found,
                           std::vector<uint64_t>* unreadable) {
  std::vector<uint64_t> on_disk;
  for (uint64_t slot : slots) {
    if (slot < options_.capacity_slots && SlabOnDisk(slot / options_.slots_per_slab))
      on_disk.push_back(slot);
  }
  const uint32_t whole_payload = static_cast<uint32_t>(options_.slot_bytes - header_bytes());
  for (int attempt = 1; !on_disk.empty(); ++attempt) {
    std::vector<uint64_t> failed;  // read again in the next attempt
    absl::Status last_error;
    for (size_t round = 0; round < on_disk.size(); round += options_.queue_depth) {
      const size_t n = std::min<size_t>(options_.queue_depth, on_disk.size() - round);
      LaneLease lane(this);
      std::vector<IoOp> ops;
      for (size_t i = 0; i < n; ++i) {
        KVC_ASSIGN_OR_RETURN(IoOp op, SlotOp(IoOp::Kind::kRead, on_disk[round + i], whole_payload,
                                             *lane, static_cast<int>(i)));
        ops.push_back(op);
      }
      lane->engine->Execute(ops, nullptr, [&](size_t k) {
        const uint64_t slot = on_disk[round + k];
        if (ops[k].result != ops[k].len) {
          failed.push_back(slot);
          last_error = IoError("read", slot, ops[k].result, ops[k].len);
          return;
        }
        const std::span<const uint8_t> bytes(ops[k].buf, ops[k].len);
        absl::StatusOr<DecodedSlot> d = DecodeSlotHeader(bytes);
        if (d.ok() && VerifyPayload(*d, bytes).ok()) found(slot, d->header);
      });
    }
    if (failed.empty()) break;
    if (attempt == kScanReadAttempts) {
      if (unreadable == nullptr) return last_error;
      unreadable->insert(unreadable->end(), failed.begin(), failed.end());
      break;
    }
    on_disk = std::move(failed);
  }
  return absl::OkStatus();
}

}  // namespace kvc::storage
