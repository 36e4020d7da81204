// ChunkIndex: the durable truth of what the SSD tier holds, in RocksDB (WAL on). A full
// disk is ResourceExhausted, and writes resume by themselves once space is back.
//
// Keys: "k" + 16-byte chunk key → IndexRecord ("c" + key in folders made before size
// classes: still read, rewritten as "k" on the next change); "m" + name → metadata (slot size,
// namespaces). The store loads every record into memory at open and serves lookups from
// there; RocksDB is written on every change and read only at open. Thread-safe (RocksDB
// is); errors are InternalError with RocksDB's message.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/chunk_key.h"

namespace rocksdb {
class DB;
class WriteBatch;
class Env;
class FileSystem;
}  // namespace rocksdb

namespace kvc::storage {

struct IndexRecord {
  NamespaceId namespace_id = 0;
  uint32_t payload_bytes = 0;
  uint32_t slab = 0;
  uint32_t slot = 0;
  uint64_t checksum = 0;  // XXH3-64 of the payload
  uint64_t sequence = 0;  // matches the slot header
  std::optional<ChunkKey> parent;
  int64_t created_s = 0;
  int64_t last_access_s = 0;          // coarse: persisted on pin, erase and close
  int64_t pin_until_s = 0;            // 0: not pinned
  int64_t expires_s = 0;              // 0: no TTL
  std::optional<ChunkOrigin> origin;  // the client's key and parent (none: stored without)
  // The slot's size class: its slot bytes, or 0 for the class of a folder made before size
  // classes (its slabs/ folder; records of versions 1 and 2 say 0).
  uint32_t slot_class = 0;
};

std::string EncodeIndexRecord(const IndexRecord& r);
// DataLoss if the bytes are not a record this version wrote.
absl::StatusOr<IndexRecord> DecodeIndexRecord(const std::string& bytes);

class ChunkIndex {
 public:
  // A WAL damaged anywhere but at its tail (where a crash tears the last record, which is
  // dropped), or a file that does not read, is DataLoss naming the damage: the caller
  // then salvages the index (OpenDamaged) and rebuilds what it lost from the slots.
  // `fs` (tests: a power-cut seam) replaces the default file system.
  static absl::StatusOr<std::unique_ptr<ChunkIndex>> Open(
      const std::string& dir, std::shared_ptr<rocksdb::FileSystem> fs = nullptr);
  // Opens a damaged index keeping every record that still reads (damaged WAL records are
  // skipped). If even that fails, or keep_records is false (its files do not read), the
  // folder is moved aside to `dir`.damaged-<unix time> (named in *moved_to) and an empty
  // index is made in its place.
  static absl::StatusOr<std::unique_ptr<ChunkIndex>> OpenDamaged(
      const std::string& dir, bool keep_records, std::string* moved_to,
      std::shared_ptr<rocksdb::FileSystem> fs = nullptr);
  ~ChunkIndex();

  absl::StatusOr<std::optional<std::string>> GetMeta(const std::string& name);
  [[nodiscard]] absl::Status PutMeta(const std::string& name, const std::string& value);

  // One chunk's record, if the index has one (a point read, for lookups served while the
  // store loads the index in the background). DataLoss if its bytes do not decode.
  absl::StatusOr<std::optional<IndexRecord>> Get(const ChunkKey& key);

  // Calls fn for every chunk record; stops at and returns the first decode error.
  [[nodiscard]] absl::Status ForEach(
      const std::function<void(const ChunkKey&, const IndexRecord&)>& fn);

  // Applies puts, deletes and metadata puts atomically. sync = the WAL is fsynced before
  // returning (which makes every earlier commit durable too).
  [[nodiscard]] absl::Status Commit(
      const std::vector<std::pair<ChunkKey, IndexRecord>>& puts,
      const std::vector<ChunkKey>& deletes, bool sync,
      const std::vector<std::pair<std::string, std::string>>& meta = {});

 private:
  ChunkIndex(rocksdb::DB* db, std::unique_ptr<rocksdb::Env> env);
  // One write; after an I/O error it resumes the database (see the .cc) and tries again once.
  absl::Status Write(rocksdb::WriteBatch& batch, bool sync);
  std::unique_ptr<rocksdb::Env> env_;  // outlives db_
  std::unique_ptr<rocksdb::DB> db_;
  // ForEach found rows of the legacy prefix: changes delete them too.
  std::atomic<bool> legacy_rows_{false};
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer only: RocksDB (not instrumented) lets one writer append the
  // others' batches through its own atomics, which TSan cannot see, so it reports the hand-off
  // as a race in our frames. One writer at a time keeps the check on our code exact.
  std::mutex tsan_write_mu_;
#endif
};

}  // namespace kvc::storage
