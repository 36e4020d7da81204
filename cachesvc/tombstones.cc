#include "cachesvc/tombstones.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/file.h"
#include "base/status_macros.h"

namespace kvc::cachesvc {
namespace {

// One record: kind (u32: 1 deleted, 2 stored again), store_id (u32), when (i64, unix s),
// the stored key (16 bytes), then XXH3-64 of those 32 bytes. Little-endian, as the host.
constexpr size_t kRecordBytes = 40;
constexpr uint32_t kDeleted = 1, kCleared = 2;

std::string Record(uint32_t kind, uint32_t store_id, int64_t at, const storage::ChunkKey& key) {
  std::string r(kRecordBytes, '\0');
  std::memcpy(r.data(), &kind, 4);
  std::memcpy(r.data() + 4, &store_id, 4);
  std::memcpy(r.data() + 8, &at, 8);
  std::memcpy(r.data() + 16, key.bytes.data(), 16);
  const uint64_t sum = XXH3_64bits(r.data(), 32);
  std::memcpy(r.data() + 32, &sum, 8);
  return r;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tombstones>> Tombstones::Open(const std::string& data_dir,
                                                             Options options) {
  if (!options.now_s) options.now_s = [] { return WallSeconds(); };
  std::unique_ptr<Tombstones> t(new Tombstones(data_dir + "/tombstones.log", std::move(options)));
  KVC_RETURN_IF_ERROR(t->Load());
  return t;
}

Tombstones::~Tombstones() {
  MutexLock lk(mu_);
  if (fd_ >= 0) close(fd_);
}

absl::Status Tombstones::Load() {
  MutexLock lk(mu_);
  std::string text;
  if (std::ifstream in(path_, std::ios::binary); in) {
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  // A record torn by a crash is the last one, short: dropped with the rewrite below.
  const size_t whole = text.size() / kRecordBytes;
  for (size_t i = 0; i < whole; ++i) {
    const char* r = text.data() + i * kRecordBytes;
    uint64_t sum = 0;
    std::memcpy(&sum, r + 32, 8);
    uint32_t kind = 0, store_id = 0;
    int64_t at = 0;
    std::memcpy(&kind, r, 4);
    std::memcpy(&store_id, r + 4, 4);
    std::memcpy(&at, r + 8, 8);
    if (sum != XXH3_64bits(r, 32) || (kind != kDeleted && kind != kCleared)) {
      return absl::DataLossError(absl::StrCat(path_, ": record ", i, " (byte ", i * kRecordBytes,
                                              ") is damaged; remove the file to start without "
                                              "tombstones (deleted chunks may then come back)"));
    }
    Id id{store_id, {}};
    std::memcpy(id.key.bytes.data(), r + 16, 16);
    if (kind == kDeleted) {
      InsertLocked(id, at);
    } else {
      live_.erase(id);
    }
  }
  ExpireLocked(opt_.now_s());
  // Compacted: the live tombstones only, written aside and renamed over the log.
  std::string live;
  for (const auto& [at, id] : order_) {
    auto it = live_.find(id);
    if (it != live_.end() && it->second == at) live += Record(kDeleted, id.store_id, at, id.key);
  }
  KVC_RETURN_IF_ERROR(ReplaceFileDurably(path_.substr(0, path_.rfind('/')), path_, live));
  fd_ = open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) return ErrnoError("open " + path_);
  return absl::OkStatus();
}

void Tombstones::InsertLocked(const Id& id, int64_t at) {
  live_[id] = at;
  order_.emplace_back(at, id);
  // Over the bound, the oldest live ones go first (counted: the guarantee is weaker for them).
  while (live_.size() > opt_.max_entries && !order_.empty()) {
    const auto [when, old] = order_.front();
    order_.pop_front();
    auto it = live_.find(old);
    if (it != live_.end() && it->second == when) {
      live_.erase(it);
      ++dropped_early_;
    }
  }
}

void Tombstones::ExpireLocked(int64_t now) {
  while (!order_.empty() && order_.front().first + opt_.keep_s <= now) {
    const auto [when, id] = order_.front();
    order_.pop_front();
    auto it = live_.find(id);
    if (it != live_.end() && it->second == when) live_.erase(it);
  }
}

absl::Status Tombstones::AppendRecords(const std::string& bytes) {
  KVC_RETURN_IF_ERROR(WriteAll(fd_, bytes, path_));
  if (fdatasync(fd_) != 0) return ErrnoError("fdatasync " + path_);
  return absl::OkStatus();
}

absl::Status Tombstones::Add(uint32_t store_id, std::span<const storage::ChunkKey> stored) {
  if (stored.empty()) return absl::OkStatus();
  const int64_t now = opt_.now_s();
  std::string records;
  records.reserve(stored.size() * kRecordBytes);
  for (const storage::ChunkKey& k : stored) records += Record(kDeleted, store_id, now, k);
  MutexLock lk(mu_);
  // On disk first: a tombstone the node does not keep across a restart is no promise.
  KVC_RETURN_IF_ERROR(AppendRecords(records));
  ExpireLocked(now);
  for (const storage::ChunkKey& k : stored) InsertLocked({store_id, k}, now);
  return absl::OkStatus();
}

bool Tombstones::Deleted(uint32_t store_id, const storage::ChunkKey& stored) const {
  MutexLock lk(mu_);
  if (live_.empty()) return false;
  auto it = live_.find({store_id, stored});
  return it != live_.end() && it->second + opt_.keep_s > opt_.now_s();
}

absl::Status Tombstones::Clear(uint32_t store_id, const storage::ChunkKey& stored) {
  MutexLock lk(mu_);
  auto it = live_.find({store_id, stored});
  if (it == live_.end()) return absl::OkStatus();
  KVC_RETURN_IF_ERROR(AppendRecords(Record(kCleared, store_id, opt_.now_s(), stored)));
  live_.erase(it);
  return absl::OkStatus();
}

size_t Tombstones::size() const {
  MutexLock lk(mu_);
  return live_.size();
}

uint64_t Tombstones::dropped_early() const {
  MutexLock lk(mu_);
  return dropped_early_;
}

}  // namespace kvc::cachesvc
