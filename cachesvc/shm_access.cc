#include "cachesvc/shm_access.h"

#include "cachesvc/tenant_quotas.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace kvc::cachesvc {

absl::StatusOr<ShmAccess> ShmAccess::Plan(absl::string_view flag, bool auth_enabled,
                                          uint64_t ram_bytes) {
  ShmAccess a;
  a.auth_enabled_ = auth_enabled;
  a.default_pool_bytes_ = ram_bytes;
  if (!auth_enabled) return a;  // one tenant: pool 0 is its own
  std::vector<std::optional<uint64_t>> sizes;
  for (absl::string_view item : absl::StrSplit(flag, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    const std::string name(absl::StripAsciiWhitespace(kv.first));
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shm-tenants item '", item, "' names no tenant"));
    }
    if (a.pools_.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shm-tenants names tenant '", name, "' twice"));
    }
    std::optional<uint64_t> size;
    if (item.find('=') != absl::string_view::npos) {
      KVC_ASSIGN_OR_RETURN(
          uint64_t b, ParseByteSize("--shm-tenants", item, absl::StripAsciiWhitespace(kv.second)));
      size = b;
    }
    a.pools_[name] = static_cast<storage::RamPoolId>(sizes.size() + 1);
    sizes.push_back(size);
  }
  uint64_t sized = 0;
  uint64_t unsized = 1;  // pool 0 takes a share too
  for (const auto& s : sizes) {
    if (s) {
      sized += *s;
    } else {
      ++unsized;
    }
  }
  if (sized > ram_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm-tenants asks for ", sized, " bytes of RAM pools; --ram-bytes is ", ram_bytes));
  }
  const uint64_t share = (ram_bytes - sized) / unsized;
  for (const auto& s : sizes) a.private_pool_bytes_.push_back(s ? *s : share);
  a.default_pool_bytes_ = ram_bytes - sized - share * (unsized - 1);
  return a;
}

std::optional<storage::RamPoolId> ShmAccess::PoolOf(const std::string& tenant) const {
  if (!auth_enabled_) return storage::RamPoolId{0};
  auto it = pools_.find(tenant);
  if (it == pools_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<storage::RamPoolId> ShmAccess::MappablePool(const std::string& tenant,
                                                           const storage::ChunkStore& store) const {
  const std::optional<storage::RamPoolId> pool = PoolOf(tenant);
  if (!pool) {
    return absl::PermissionDeniedError(absl::StrCat("tenant may not map shared memory: ", tenant,
                                                    " is not in kvcached --shm-tenants"));
  }
  if (store.ram_arena_fd(*pool) < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("RAM pool ", *pool, " of tenant ", tenant, " has no slots"));
  }
  return *pool;
}

std::set<std::string> ShmAccess::tenants() const {
  std::set<std::string> out;
  for (const auto& [name, pool] : pools_) out.insert(name);
  return out;
}

}  // namespace kvc::cachesvc
