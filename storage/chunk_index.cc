#include "storage/chunk_index.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvc::storage {
namespace {

// Version 2 appends the chunk's origin (a flags byte: bit 0 origin, bit 1 its parent; then
// the two keys) to version 1; version 3 appends the slot's size class (4 bytes). The
// decoder reads all three (earlier ones: no origin, the folder's first class).
constexpr uint8_t kRecordVersion = 3;
constexpr size_t kRecordBytesV1 = 1 + 4 + 4 + 4 + 4 + 8 + 8 + 1 + 16 + 8 * 4;
constexpr size_t kRecordBytesV2 = kRecordBytesV1 + 1 + 16 + 16;
constexpr size_t kRecordBytes = kRecordBytesV2 + 4;

// Records of versions 1 and 2 are rows "c" + key; version 3 rows are "k" + key, which a
// kvcached of before size classes never reads (it would take them for damage and rebuild
// its index from its own slab folder, losing every chunk of the other classes): it opens
// such a folder only to refuse its slot format (slot_format.h).
constexpr char kLegacyRowPrefix = 'c';
constexpr char kRowPrefix = 'k';

std::string ChunkRowKey(const ChunkKey& k, char prefix = kRowPrefix) {
  std::string s(17, prefix);
  std::memcpy(s.data() + 1, k.bytes.data(), 16);
  return s;
}

absl::Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat("rocksdb ", what, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

rocksdb::Options IndexOptions() {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.max_background_jobs = 2;
  options.keep_log_file_num = 4;
  options.max_log_file_size = 8 << 20;
  // A restart after a crash replays the write-ahead log written since the last flush into
  // a memtable record by record; at RocksDB's default 64 MB that is ~300,000 records and
  // most of the restart (kvbench restart, 2026-12-05: 1.85 s to listening at 300,000
  // chunks, 0.71 s with 8 MB). A smaller memtable flushes more often in the background and
  // keeps that replay short.
  options.write_buffer_size = 8 << 20;
  // A crash tears at most the WAL's last record; damage anywhere else fails the open
  // instead of silently dropping every later record (RocksDB's default stops there).
  // (RocksDB turns WAL recycling off in this mode; durable puts no longer sync the WAL.)
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  return options;
}

class Writer {
 public:
  template <typename T>
  void Add(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T>
  T Take() {
    T v{};
    std::memcpy(&v, s_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }

 private:
  const std::string& s_;
  size_t at_ = 0;
};

}  // namespace

std::string EncodeIndexRecord(const IndexRecord& r) {
  Writer w;
  w.Add<uint8_t>(kRecordVersion);
  w.Add(r.namespace_id);
  w.Add(r.payload_bytes);
  w.Add(r.slab);
  w.Add(r.slot);
  w.Add(r.checksum);
  w.Add(r.sequence);
  w.Add<uint8_t>(r.parent.has_value());
  w.Add(r.parent.value_or(ChunkKey{}).bytes);
  w.Add(r.created_s);
  w.Add(r.last_access_s);
  w.Add(r.pin_until_s);
  w.Add(r.expires_s);
  const ChunkOrigin origin = r.origin.value_or(ChunkOrigin{});
  w.Add<uint8_t>((r.origin ? 1 : 0) | (origin.parent ? 2 : 0));
  w.Add(origin.key.bytes);
  w.Add(origin.parent.value_or(ChunkKey{}).bytes);
  w.Add(r.slot_class);
  return w.out;
}

absl::StatusOr<IndexRecord> DecodeIndexRecord(const std::string& bytes) {
  const uint8_t version = bytes.empty() ? 0 : static_cast<uint8_t>(bytes[0]);
  if (!(version == kRecordVersion && bytes.size() == kRecordBytes) &&
      !(version == 2 && bytes.size() == kRecordBytesV2) &&
      !(version == 1 && bytes.size() == kRecordBytesV1)) {
    return absl::DataLossError(absl::StrCat("index record of ", bytes.size(), " bytes, version ",
                                            bytes.empty() ? -1 : static_cast<uint8_t>(bytes[0]),
                                            "; expected ", kRecordBytes, " bytes, version ",
                                            kRecordVersion));
  }
  Reader r(bytes);
  IndexRecord rec;
  r.Take<uint8_t>();
  rec.namespace_id = r.Take<uint32_t>();
  rec.payload_bytes = r.Take<uint32_t>();
  rec.slab = r.Take<uint32_t>();
  rec.slot = r.Take<uint32_t>();
  rec.checksum = r.Take<uint64_t>();
  rec.sequence = r.Take<uint64_t>();
  const bool has_parent = r.Take<uint8_t>() != 0;
  const auto parent = r.Take<std::array<uint8_t, 16>>();
  if (has_parent) rec.parent = ChunkKey{parent};
  rec.created_s = r.Take<int64_t>();
  rec.last_access_s = r.Take<int64_t>();
  rec.pin_until_s = r.Take<int64_t>();
  rec.expires_s = r.Take<int64_t>();
  if (version >= 2) {
    const uint8_t flags = r.Take<uint8_t>();
    ChunkOrigin origin;
    origin.key = ChunkKey{r.Take<std::array<uint8_t, 16>>()};
    const auto origin_parent = r.Take<std::array<uint8_t, 16>>();
    if (flags & 2) origin.parent = ChunkKey{origin_parent};
    if (flags & 1) rec.origin = origin;
  }
  if (version >= 3) rec.slot_class = r.Take<uint32_t>();
  return rec;
}

absl::StatusOr<std::unique_ptr<ChunkIndex>> ChunkIndex::Open(
    const std::string& dir, std::shared_ptr<rocksdb::FileSystem> fs) {
  rocksdb::Options options = IndexOptions();
  std::unique_ptr<rocksdb::Env> env = fs ? rocksdb::NewCompositeEnv(fs) : nullptr;
  if (env) options.env = env.get();
  rocksdb::DB* db = nullptr;
  if (absl::Status s = FromRocks(rocksdb::DB::Open(options, dir, &db), "open"); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (index at ", dir, ")"));
  }
  return std::unique_ptr<ChunkIndex>(new ChunkIndex(db, std::move(env)));
}

absl::StatusOr<std::unique_ptr<ChunkIndex>> ChunkIndex::OpenDamaged(
    const std::string& dir, bool keep_records, std::string* moved_to,
    std::shared_ptr<rocksdb::FileSystem> fs) {
  rocksdb::Options options = IndexOptions();
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords;
  std::unique_ptr<rocksdb::Env> env = fs ? rocksdb::NewCompositeEnv(fs) : nullptr;
  if (env) options.env = env.get();
  rocksdb::DB* db = nullptr;
  if (keep_records && rocksdb::DB::Open(options, dir, &db).ok())
    return std::unique_ptr<ChunkIndex>(new ChunkIndex(db, std::move(env)));
  *moved_to = absl::StrCat(dir, ".damaged-", time(nullptr));
  if (std::rename(dir.c_str(), moved_to->c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot move the damaged index ", dir, " aside: ", strerror(errno)));
  }
  return Open(dir, fs);
}

ChunkIndex::ChunkIndex(rocksdb::DB* db, std::unique_ptr<rocksdb::Env> env)
    : env_(std::move(env)), db_(db) {}

ChunkIndex::~ChunkIndex() {
  if (db_) (void)db_->Close();
}

absl::StatusOr<std::optional<std::string>> ChunkIndex::GetMeta(const std::string& name) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), "m" + name, &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  KVC_RETURN_IF_ERROR(FromRocks(s, "get"));
  return std::optional<std::string>(std::move(value));
}

absl::Status ChunkIndex::PutMeta(const std::string& name, const std::string& value) {
  rocksdb::WriteBatch batch;
  batch.Put("m" + name, value);
  return Write(batch, /*sync=*/true);
}

absl::Status ChunkIndex::Write(rocksdb::WriteBatch& batch, bool sync) {
  rocksdb::WriteOptions w;
  w.sync = sync;
#if defined(__SANITIZE_THREAD__)
  std::lock_guard tsan_serial(tsan_write_mu_);
#endif
  rocksdb::Status s = db_->Write(w, &batch);
  if (!s.ok() && !s.IsCorruption()) {
    // After an I/O error RocksDB refuses every write until it is resumed. For a full disk
    // its own recovery polls the free space every 5 s and resumes by itself (Resume answers
    // Busy meanwhile: DiskFullTest measures writes back 5.0 s after space returns); other
    // errors wait for a Resume, tried here, so writes come back without a restart.
    if (db_->Resume().ok()) s = db_->Write(w, &batch);
  }
  return FromRocks(s, "write");
}

absl::StatusOr<std::optional<IndexRecord>> ChunkIndex::Get(const ChunkKey& key) {
  // As ForEach reads them: a "k" row wins over a legacy "c" row of the same key.
  for (const char prefix : {kRowPrefix, kLegacyRowPrefix}) {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ChunkRowKey(key, prefix), &value);
    if (s.IsNotFound()) continue;
    KVC_RETURN_IF_ERROR(FromRocks(s, "get"));
    KVC_ASSIGN_OR_RETURN(IndexRecord rec, DecodeIndexRecord(value));
    return std::optional<IndexRecord>(std::move(rec));
  }
  return std::optional<IndexRecord>();
}

absl::Status ChunkIndex::ForEach(
    const std::function<void(const ChunkKey&, const IndexRecord&)>& fn) {
  // Legacy rows first: a key with both (never written so, but a crash between versions
  // cannot make it so either: puts delete the legacy row in the same batch) reads as "k".
  for (const char prefix : {kLegacyRowPrefix, kRowPrefix}) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    const std::string p(1, prefix);
    for (it->Seek(p); it->Valid() && it->key().starts_with(p); it->Next()) {
      if (it->key().size() != 17) {
        return absl::DataLossError(absl::StrCat("index key of ", it->key().size(), " bytes"));
      }
      ChunkKey key;
      std::memcpy(key.bytes.data(), it->key().data() + 1, 16);
      KVC_ASSIGN_OR_RETURN(IndexRecord rec, DecodeIndexRecord(it->value().ToString()));
      if (prefix == kLegacyRowPrefix) legacy_rows_ = true;
      fn(key, rec);
    }
    KVC_RETURN_IF_ERROR(FromRocks(it->status(), "scan"));
  }
  return absl::OkStatus();
}

absl::Status ChunkIndex::Commit(const std::vector<std::pair<ChunkKey, IndexRecord>>& puts,
                                const std::vector<ChunkKey>& deletes, bool sync,
                                const std::vector<std::pair<std::string, std::string>>& meta) {
  if (puts.empty() && deletes.empty() && meta.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (const auto& [name, value] : meta) batch.Put("m" + name, value);
  // In a folder upgraded from before size classes (its records are kept as they were until
  // each is rewritten), a put or delete also deletes the key's legacy row.
  const bool legacy = legacy_rows_;
  for (const auto& [key, rec] : puts) {
    batch.Put(ChunkRowKey(key), EncodeIndexRecord(rec));
    if (legacy) batch.Delete(ChunkRowKey(key, kLegacyRowPrefix));
  }
  for (const ChunkKey& key : deletes) {
    batch.Delete(ChunkRowKey(key));
    if (legacy) batch.Delete(ChunkRowKey(key, kLegacyRowPrefix));
  }
  return Write(batch, sync);
}

}  // namespace kvc::storage
