#include "storage/power_cut.h"

#include <fcntl.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace kvc::storage {
namespace {

std::string FdPath(int fd) {
  std::error_code ec;
  return std::filesystem::read_symlink(absl::StrCat("/proc/self/fd/", fd), ec).string();
}

class PowerCutIoEngine final : public IoEngine {
 public:
  PowerCutIoEngine(std::unique_ptr<IoEngine> base, std::shared_ptr<PowerCut> cut)
      : base_(std::move(base)), cut_(std::move(cut)) {}
  const char* name() const override { return base_->name(); }
  absl::Status RegisterBuffers(std::span<const iovec> b) override {
    return base_->RegisterBuffers(b);
  }
  void Execute(std::span<IoOp> ops, const IoPrepareFn& on_prepare,
               const IoDoneFn& on_done) override {
    if (cut_->cut()) {
      // No power: reads still answer (the store is shutting down), writes go nowhere.
      for (size_t k = 0; k < ops.size(); ++k) {
        if (ops[k].kind == IoOp::Kind::kWrite) {
          if (on_prepare) on_prepare(k);
          ops[k].result = ops[k].len;
          if (on_done) on_done(k);
        }
      }
      // One at a time, each prepared first (it may be lent its buffer then).
      for (size_t k = 0; k < ops.size(); ++k) {
        if (ops[k].kind != IoOp::Kind::kRead) continue;
        if (on_prepare) on_prepare(k);
        base_->Execute(std::span(&ops[k], 1), nullptr, nullptr);
        if (on_done) on_done(k);
      }
      return;
    }
    // Remember what each write replaces before it goes out.
    std::vector<uint64_t> ids;
    for (const IoOp& op : ops) {
      if (op.kind != IoOp::Kind::kWrite) continue;
      void* raw = std::aligned_alloc(4096, op.len);
      std::vector<uint8_t> before(op.len, 0);
      const ssize_t n = pread(op.fd, raw, op.len, static_cast<off_t>(op.offset));
      if (n > 0) std::memcpy(before.data(), raw, static_cast<size_t>(n));
      std::free(raw);
      ids.push_back(cut_->RecordSlabWrite(op.fd, op.offset, std::move(before)));
    }
    base_->Execute(ops, on_prepare, on_done);
    for (uint64_t id : ids) cut_->SlabWriteDone(id);
  }
  absl::Status Sync(int fd) override {
    if (cut_->cut()) return absl::OkStatus();
    const uint64_t covered = cut_->NextSlabWriteId();
    absl::Status s = base_->Sync(fd);
    if (s.ok()) cut_->SlabSynced(fd, covered);
    return s;
  }

 private:
  std::unique_ptr<IoEngine> base_;
  std::shared_ptr<PowerCut> cut_;
};

using rocksdb::FileOptions;
using rocksdb::FSWritableFile;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

class PowerCutFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  PowerCutFile(std::unique_ptr<FSWritableFile> f, std::string path, std::shared_ptr<PowerCut> cut,
               uint64_t length)
      : FSWritableFileOwnerWrapper(std::move(f)),
        path_(std::move(path)),
        cut_(std::move(cut)),
        length_(length) {}
  IOStatus Append(const Slice& data, const IOOptions& o, IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    if (cut_->disk_full()) return IOStatus::NoSpace("disk full (test)");
    IOStatus s = target()->Append(data, o, d);
    if (s.ok()) cut_->IndexFileAppended(path_, length_ += data.size());
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& o, const rocksdb::DataVerificationInfo& v,
                  IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    if (cut_->disk_full()) return IOStatus::NoSpace("disk full (test)");
    IOStatus s = target()->Append(data, o, v, d);
    if (s.ok()) cut_->IndexFileAppended(path_, length_ += data.size());
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& o,
                            IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    if (cut_->disk_full()) return IOStatus::NoSpace("disk full (test)");
    IOStatus s = target()->PositionedAppend(data, offset, o, d);
    if (s.ok()) cut_->IndexFileAppended(path_, length_ = std::max(length_, offset + data.size()));
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& o,
                            const rocksdb::DataVerificationInfo& v, IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    if (cut_->disk_full()) return IOStatus::NoSpace("disk full (test)");
    IOStatus s = target()->PositionedAppend(data, offset, o, v, d);
    if (s.ok()) cut_->IndexFileAppended(path_, length_ = std::max(length_, offset + data.size()));
    return s;
  }
  IOStatus Truncate(uint64_t size, const IOOptions& o, IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    return target()->Truncate(size, o, d);
  }
  IOStatus Flush(const IOOptions& o, IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    return target()->Flush(o, d);
  }
  IOStatus Sync(const IOOptions& o, IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    IOStatus s = target()->Sync(o, d);
    if (s.ok()) cut_->IndexFileSynced(path_);
    return s;
  }
  IOStatus Fsync(const IOOptions& o, IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    IOStatus s = target()->Fsync(o, d);
    if (s.ok()) cut_->IndexFileSynced(path_);
    return s;
  }
  IOStatus RangeSync(uint64_t, uint64_t, const IOOptions&, IODebugContext*) override {
    return IOStatus::OK();  // only a hint to start writeback; never a durability point
  }

 private:
  std::string path_;
  std::shared_ptr<PowerCut> cut_;
  uint64_t length_;
};

class PowerCutFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  explicit PowerCutFileSystem(std::shared_ptr<PowerCut> cut)
      : FileSystemWrapper(rocksdb::FileSystem::Default()), cut_(std::move(cut)) {}
  const char* Name() const override { return "kvcache-power-cut"; }

  IOStatus NewWritableFile(const std::string& f, const FileOptions& o,
                           std::unique_ptr<FSWritableFile>* r, IODebugContext* d) override {
    IOStatus s = target()->NewWritableFile(f, o, r, d);
    if (s.ok()) {
      cut_->IndexFileOpened(f, 0, cut_->cut());
      *r = std::make_unique<PowerCutFile>(std::move(*r), f, cut_, 0);
    }
    return s;
  }
  IOStatus ReopenWritableFile(const std::string& f, const FileOptions& o,
                              std::unique_ptr<FSWritableFile>* r, IODebugContext* d) override {
    IOStatus s = target()->ReopenWritableFile(f, o, r, d);
    if (s.ok()) {
      std::error_code ec;
      const uint64_t length = std::filesystem::file_size(f, ec);
      cut_->IndexFileOpened(f, ec ? 0 : length, cut_->cut());
      *r = std::make_unique<PowerCutFile>(std::move(*r), f, cut_, ec ? 0 : length);
    }
    return s;
  }
  IOStatus ReuseWritableFile(const std::string& f, const std::string& old, const FileOptions& o,
                             std::unique_ptr<FSWritableFile>* r, IODebugContext* d) override {
    IOStatus s = target()->ReuseWritableFile(f, old, o, r, d);
    if (s.ok()) {
      cut_->IndexFileDeleted(old);
      cut_->IndexFileOpened(f, 0, cut_->cut());
      *r = std::make_unique<PowerCutFile>(std::move(*r), f, cut_, 0);
    }
    return s;
  }
  IOStatus RenameFile(const std::string& from, const std::string& to, const IOOptions& o,
                      IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    IOStatus s = target()->RenameFile(from, to, o, d);
    if (s.ok()) cut_->IndexFileRenamed(from, to);
    return s;
  }
  IOStatus DeleteFile(const std::string& f, const IOOptions& o, IODebugContext* d) override {
    if (cut_->cut()) return IOStatus::OK();
    IOStatus s = target()->DeleteFile(f, o, d);
    if (s.ok()) cut_->IndexFileDeleted(f);
    return s;
  }

 private:
  std::shared_ptr<PowerCut> cut_;
};

}  // namespace

std::unique_ptr<IoEngine> PowerCut::WrapIoEngine(std::unique_ptr<IoEngine> base) {
  return std::make_unique<PowerCutIoEngine>(std::move(base), shared_from_this());
}

std::shared_ptr<rocksdb::FileSystem> PowerCut::file_system() {
  return std::make_shared<PowerCutFileSystem>(shared_from_this());
}

uint64_t PowerCut::RecordSlabWrite(int fd, uint64_t offset, std::vector<uint8_t> before) {
  MutexLock lock(mu_);
  const uint64_t id = next_write_id_++;
  unsynced_[id] = SlabWrite{FdPath(fd), offset, std::move(before), false};
  return id;
}

void PowerCut::SlabWriteDone(uint64_t id) {
  MutexLock lock(mu_);
  if (auto it = unsynced_.find(id); it != unsynced_.end()) it->second.done = true;
}

void PowerCut::SlabSynced(int fd, uint64_t first_unsynced) {
  const std::string path = FdPath(fd);
  MutexLock lock(mu_);
  if (cut()) return;
  for (auto it = unsynced_.begin(); it != unsynced_.end() && it->first < first_unsynced;) {
    if (it->second.done && it->second.path == path) {
      it = unsynced_.erase(it);
    } else {
      ++it;
    }
  }
}

void PowerCut::IndexFileOpened(const std::string& path, uint64_t length, bool created_after_cut) {
  MutexLock lock(mu_);
  index_files_[path] = IndexFile{length, length, created_after_cut};
}

void PowerCut::IndexFileAppended(const std::string& path, uint64_t end) {
  MutexLock lock(mu_);
  IndexFile& f = index_files_[path];
  f.length = std::max(f.length, end);
}

void PowerCut::IndexFileSynced(const std::string& path) {
  MutexLock lock(mu_);
  if (cut()) return;
  IndexFile& f = index_files_[path];
  f.synced = f.length;
}

void PowerCut::IndexFileRenamed(const std::string& from, const std::string& to) {
  MutexLock lock(mu_);
  auto it = index_files_.find(from);
  if (it == index_files_.end()) return;
  index_files_[to] = it->second;
  index_files_.erase(it);
}

void PowerCut::IndexFileDeleted(const std::string& path) {
  MutexLock lock(mu_);
  index_files_.erase(path);
}

absl::Status PowerCut::Restore() {
  MutexLock lock(mu_);
  // Slab writes, newest first, so that dropping one brings back what the one before it
  // wrote (itself then kept, dropped or torn in turn).
  for (auto it = unsynced_.rbegin(); it != unsynced_.rend(); ++it) {
    const SlabWrite& w = it->second;
    const uint64_t fate = drop_all_ ? 1 : rng_() % 3;
    if (fate == 0) {
      ++counts_.slab_writes_kept;
      continue;
    }
    // Dropped: all of it goes back; torn: the sectors from a random one on go back.
    const size_t sectors = (w.before.size() + 4095) / 4096;
    const size_t from = fate == 1 ? 0 : 1 + rng_() % std::max<size_t>(1, sectors);
    if (from >= sectors) {
      ++counts_.slab_writes_kept;
      continue;
    }
    ++(fate == 1 ? counts_.slab_writes_dropped : counts_.slab_writes_torn);
    const int fd = open(w.path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("open ", w.path, ": ", strerror(errno)));
    const size_t at = from * 4096;
    const ssize_t n =
        pwrite(fd, w.before.data() + at, w.before.size() - at, static_cast<off_t>(w.offset + at));
    const int err = errno;
    fsync(fd);
    close(fd);
    if (n != static_cast<ssize_t>(w.before.size() - at))
      return absl::InternalError(absl::StrCat("restore ", w.path, ": ", strerror(err)));
  }
  unsynced_.clear();
  for (const auto& [path, f] : index_files_) {
    std::error_code ec;
    if (f.created_after_cut) {
      std::filesystem::remove(path, ec);
      continue;
    }
    const uint64_t on_disk = std::filesystem::file_size(path, ec);
    if (ec || on_disk <= f.synced) continue;
    const uint64_t keep = drop_all_ ? f.synced : f.synced + rng_() % (on_disk - f.synced + 1);
    if (keep == on_disk) continue;
    std::filesystem::resize_file(path, keep, ec);
    if (ec) return absl::InternalError(absl::StrCat("truncate ", path, ": ", ec.message()));
    ++counts_.index_files_cut;
    counts_.index_bytes_dropped += on_disk - keep;
  }
  index_files_.clear();
  return absl::OkStatus();
}

}  // namespace kvc::storage
