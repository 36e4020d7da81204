// NamespaceRegistry: the durable list of namespaces, each owned by one tenant.
// Registering the same (tenant, model, layout, chunk size) again returns the same id.
// Kept as a JSON file in the data folder, replaced atomically (write, fsync, rename).
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/chunk_key.h"

namespace kvc::cachesvc {

struct NamespaceInfo {
  uint32_t id = 0;
  std::string tenant;
  std::string model_id;
  uint32_t chunk_tokens = 0;
  uint64_t chunk_bytes = 0;
  uint64_t vocab_size = 0;
  storage::ChunkKey root;
};

class NamespaceRegistry {
 public:
  static absl::StatusOr<std::unique_ptr<NamespaceRegistry>> Open(const std::string& data_dir);

  // The existing namespace with info's tenant and root, or a new one with a fresh id.
  absl::StatusOr<NamespaceInfo> FindOrAdd(NamespaceInfo info);
  // The namespace if it exists and belongs to `tenant` (another tenant's: nullopt, so its
  // existence does not leak).
  std::optional<NamespaceInfo> Get(uint32_t id, const std::string& tenant) const;
  // Every namespace, in id order.
  std::vector<NamespaceInfo> All() const;

 private:
  explicit NamespaceRegistry(std::string path) : path_(std::move(path)) {}
  absl::Status Save() const;  // under mu_

  std::string path_;
  mutable std::mutex mu_;
  std::map<uint32_t, NamespaceInfo> by_id_;
};

}  // namespace kvc::cachesvc
