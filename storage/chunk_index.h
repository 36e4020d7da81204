// ChunkIndex: the durable truth of what the SSD tier holds, in RocksDB (WAL on).
//
// Keys: "c" + 16-byte chunk key → IndexRecord; "m" + name → metadata (slot size,
// namespaces). The store loads every record into memory at open and serves lookups from
// there; RocksDB is written on every change and read only at open. Thread-safe (RocksDB
// is); errors are InternalError with RocksDB's message.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/chunk_key.h"

namespace rocksdb {
class DB;
}

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
  int64_t last_access_s = 0;  // coarse: persisted on pin, erase and close
  int64_t pin_until_s = 0;    // 0: not pinned
  int64_t expires_s = 0;      // 0: no TTL
};

std::string EncodeIndexRecord(const IndexRecord& r);
// DataLoss if the bytes are not a record this version wrote.
absl::StatusOr<IndexRecord> DecodeIndexRecord(const std::string& bytes);

class ChunkIndex {
 public:
  static absl::StatusOr<std::unique_ptr<ChunkIndex>> Open(const std::string& dir);
  ~ChunkIndex();

  absl::StatusOr<std::optional<std::string>> GetMeta(const std::string& name);
  [[nodiscard]] absl::Status PutMeta(const std::string& name, const std::string& value);

  // Calls fn for every chunk record; stops at and returns the first decode error.
  [[nodiscard]] absl::Status ForEach(
      const std::function<void(const ChunkKey&, const IndexRecord&)>& fn);

  // Applies puts and deletes atomically. sync = the WAL is fsynced before returning.
  [[nodiscard]] absl::Status Commit(const std::vector<std::pair<ChunkKey, IndexRecord>>& puts,
                                    const std::vector<ChunkKey>& deletes, bool sync);

 private:
  explicit ChunkIndex(rocksdb::DB* db);
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace kvc::storage
