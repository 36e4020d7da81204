#include "cachesvc/namespace_registry.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "client/prefix_hash.h"
#include "nlohmann/json.hpp"

namespace kvc::cachesvc {
namespace {

constexpr char kLog[] = "/namespaces.jsonl";
constexpr char kOldArray[] = "/namespaces.json";  // before the log

bool FromHex(const std::string& s, storage::ChunkKey* k) {
  if (s.size() != 32) return false;
  for (size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    k->bytes[i] = static_cast<uint8_t>(v);
  }
  return true;
}

nlohmann::json ToJson(const NamespaceInfo& n) {
  return {{"id", n.id},
          {"store_id", n.store_id},
          {"tenant", n.tenant},
          {"model_id", n.model_id},
          {"chunk_tokens", n.chunk_tokens},
          {"chunk_bytes", n.chunk_bytes},
          {"vocab_size", n.vocab_size},
          {"root_key", n.root.Hex()},
          {"key_scope", n.key_scope},
          {"key_mode", n.key_mode}};
}

absl::StatusOr<NamespaceInfo> FromJson(const nlohmann::json& e, const std::string& where) {
  NamespaceInfo n;
  try {
    // Read wide and range-checked: a number too large for its field must fail the load,
    // not be cut to fit.
    const uint64_t id = e.at("id").get<uint64_t>();
    if (id == 0 || id > UINT32_MAX) throw std::runtime_error("id must be 1 to 2^32-1");
    n.id = static_cast<uint32_t>(id);
    // Absent: registered before ids were scoped per tenant, stored under its id.
    const uint64_t store_id = e.value("store_id", id);
    if (store_id == 0 || store_id > UINT32_MAX)
      throw std::runtime_error("store_id must be 1 to 2^32-1");
    n.store_id = static_cast<uint32_t>(store_id);
    n.tenant = e.at("tenant");
    n.model_id = e.at("model_id");
    const uint64_t chunk_tokens = e.at("chunk_tokens").get<uint64_t>();
    if (chunk_tokens > UINT32_MAX) throw std::runtime_error("chunk_tokens above 2^32-1");
    n.chunk_tokens = static_cast<uint32_t>(chunk_tokens);
    n.chunk_bytes = e.at("chunk_bytes");
    n.vocab_size = e.at("vocab_size");
    if (!FromHex(e.at("root_key"), &n.root)) throw std::runtime_error("root_key");
    n.key_scope = e.value("key_scope", 0u);  // absent: registered before keys were bound
    if (n.key_scope > kKeyScopeLatest) throw std::runtime_error("key_scope");
    n.key_mode = e.value("key_mode", kKeysFromTokens);  // absent: before caller keys
    if (n.key_mode > kKeysFromCaller) throw std::runtime_error("key_mode");
  } catch (const std::exception& ex) {
    return absl::DataLossError(
        absl::StrCat(where, ": bad namespace entry ", e.dump(), ": ", ex.what()));
  }
  return n;
}

}  // namespace

storage::ChunkKey StorageKey(const NamespaceInfo& ns, const storage::ChunkKey& key) {
  switch (ns.key_scope) {
    case kKeyScopeSeparated:
      return client::BoundChunkKeyV2(ns.root, key);
    case kKeyScopeBound:
      return client::BoundChunkKey(ns.root, key);
    default:
      return key;
  }
}

std::vector<storage::ChunkKey> StorageKeys(const NamespaceInfo& ns,
                                           std::span<const storage::ChunkKey> keys) {
  std::vector<storage::ChunkKey> out;
  out.reserve(keys.size());
  for (const storage::ChunkKey& k : keys) out.push_back(StorageKey(ns, k));
  return out;
}

uint32_t DerivedNamespaceId(const std::string& tenant, const storage::ChunkKey& root) {
  std::string buf = tenant;
  buf.push_back('\0');
  buf.append(reinterpret_cast<const char*>(root.bytes.data()), root.bytes.size());
  return 1 + static_cast<uint32_t>(XXH3_64bits(buf.data(), buf.size()) % 0x7FFFFFFFu);
}

uint64_t SharedNamespaceTag(const NamespaceInfo& ns) {
  std::string buf = "kvcache-shared-v1:";
  buf.append(reinterpret_cast<const char*>(ns.root.bytes.data()), ns.root.bytes.size());
  const uint64_t tag = XXH3_64bits(buf.data(), buf.size());
  return tag == 0 ? 1 : tag;
}

absl::StatusOr<std::unique_ptr<NamespaceRegistry>> NamespaceRegistry::Open(
    const std::string& data_dir, RegistryLimits limits, NamespaceIds ids) {
  std::unique_ptr<NamespaceRegistry> r(new NamespaceRegistry(data_dir, limits, ids));
  KVC_RETURN_IF_ERROR(r->Load());
  return r;
}

NamespaceRegistry::~NamespaceRegistry() {
  MutexLock lk(mu_);
  if (fd_ >= 0) close(fd_);
}

absl::Status NamespaceRegistry::Load() {
  MutexLock lk(mu_);  // alone (Open), but the analysis checks every access
  const std::string log = dir_ + kLog, old = dir_ + kOldArray;
  std::vector<NamespaceInfo> entries;
  std::vector<std::string> where;  // each entry's file and line, for the load's errors
  size_t good_bytes = 0;           // the log's length up to its last whole line
  if (std::ifstream in(log); in) {
    std::string line;
    size_t n = 0, at = 0;
    while (std::getline(in, line)) {
      ++n;
      const bool whole = !in.eof();  // a line without its newline was torn by a crash
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!whole || j.is_discarded()) {
        if (!whole && in.peek() == EOF) break;  // the torn tail: dropped below
        return absl::DataLossError(absl::StrCat(log, ":", n, " is not a namespace entry"));
      }
      where.push_back(absl::StrCat(log, ":", n));
      KVC_ASSIGN_OR_RETURN(NamespaceInfo e, FromJson(j, where.back()));
      entries.push_back(e);
      at += line.size() + 1;
      good_bytes = at;
    }
  } else if (std::ifstream in_old(old); in_old) {
    // An older kvcached's array: its entries become the log's first lines (below).
    std::stringstream text;
    text << in_old.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::DataLossError(absl::StrCat(old, " is not a JSON array of namespaces"));
    }
    for (const auto& e : j) {
      where.push_back(absl::StrCat(old, " entry ", where.size() + 1));
      KVC_ASSIGN_OR_RETURN(NamespaceInfo n, FromJson(e, where.back()));
      entries.push_back(n);
    }
    std::string lines;
    for (const NamespaceInfo& n : entries) lines += ToJson(n).dump() + "\n";
    KVC_RETURN_IF_ERROR(ReplaceFileDurably(dir_, log, lines));
    unlink(old.c_str());
    good_bytes = lines.size();
  }
  std::map<uint32_t, size_t> line_of_store_id;
  std::map<std::pair<std::string, uint32_t>, size_t> line_of_id;
  for (size_t i = 0; i < entries.size(); ++i) {
    const NamespaceInfo& n = entries[i];
    const auto refuse = [&](const std::string& rule) {
      return absl::FailedPreconditionError(absl::StrCat(
          where[i], ": ", rule, "; kvcached will not serve a registry that breaks it (restore ",
          "the file from a backup, or remove the entry and the chunks of its namespace)"));
    };
    if (auto seen = line_of_store_id.find(n.store_id); seen != line_of_store_id.end()) {
      return refuse(absl::StrCat("storage id ", n.store_id, " is already ", where[seen->second],
                                 "'s: each storage id holds the chunks of one namespace"));
    }
    if (auto seen = line_of_id.find({n.tenant, n.id}); seen != line_of_id.end()) {
      return refuse(absl::StrCat("namespace id ", n.id, " of tenant ", n.tenant, " is already ",
                                 where[seen->second], "'s: each id names one of its namespaces"));
    }
    if (by_root_.contains({n.tenant, n.root})) {
      return refuse(absl::StrCat("tenant ", n.tenant, " and root ", n.root.Hex(),
                                 " are registered twice: one tenant's root names one namespace"));
    }
    if (absl::Status names = CheckNames(n); !names.ok())
      return refuse(std::string(names.message()));
    if (n.chunk_bytes == 0 || n.chunk_bytes > limits_.max_chunk_bytes) {
      return refuse(absl::StrCat("chunk_bytes is ", n.chunk_bytes,
                                 "; a namespace's chunks are 1 to ", limits_.max_chunk_bytes,
                                 " bytes (kvcached --max-chunk-bytes)"));
    }
    if (n.key_mode == kKeysFromTokens && (n.chunk_tokens == 0 || n.vocab_size == 0)) {
      return refuse("a token-keyed namespace needs chunk_tokens and vocab_size above 0");
    }
    line_of_store_id[n.store_id] = i;
    line_of_id[{n.tenant, n.id}] = i;
    by_store_[n.store_id] = n;
    by_id_[{n.tenant, n.id}] = n.store_id;
    by_root_[{n.tenant, n.root}] = n.store_id;
    ++per_tenant_[n.tenant];
    bytes_per_tenant_[n.tenant] += ToJson(n).dump().size() + 1;
  }
  fd_ = open(log.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) return ErrnoError("open " + log);
  // Drop a torn tail, so the next entry starts on a line of its own.
  if (ftruncate(fd_, static_cast<off_t>(good_bytes)) != 0) return ErrnoError("truncate " + log);
  if (lseek(fd_, 0, SEEK_END) < 0) return ErrnoError("seek " + log);
  return absl::OkStatus();
}

absl::Status NamespaceRegistry::CheckNames(const NamespaceInfo& n) const {
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"tenant", &n.tenant},
        {"model_id", &n.model_id}}) {
    if (value->empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
    if (value->size() > limits_.max_name_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " is ", value->size(), " bytes; the limit is ",
                       limits_.max_name_bytes, " (kvcached --max-name-bytes)"));
    }
  }
  return absl::OkStatus();
}

absl::Status NamespaceRegistry::Append(const std::string& line) {
  const std::string log = dir_ + kLog;
  const off_t before = lseek(fd_, 0, SEEK_END);
  absl::Status s = WriteAll(fd_, line, log);
  if (s.ok() && fdatasync(fd_) != 0) s = ErrnoError("fdatasync " + log);
  if (!s.ok() && before >= 0) {
    (void)ftruncate(fd_, before);  // a failed append must not leave half a line
    (void)lseek(fd_, before, SEEK_SET);
  }
  // The log's first line also needs its directory entry to be durable.
  if (s.ok() && before == 0) s = SyncDirectory(dir_);
  return s;
}

absl::StatusOr<NamespaceInfo> NamespaceRegistry::FindOrAdd(NamespaceInfo info) {
  KVC_RETURN_IF_ERROR(CheckNames(info));
  MutexLock lk(mu_);
  if (auto it = by_root_.find({info.tenant, info.root}); it != by_root_.end()) {
    return by_store_.at(it->second);
  }
  const size_t max_per_tenant = limits_.max_per_tenant;
  if (max_per_tenant > 0 && per_tenant_[info.tenant] >= max_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", info.tenant, " has registered ", per_tenant_[info.tenant],
        " namespaces; the limit is ", max_per_tenant, " (kvcached --max-namespaces-per-tenant)"));
  }
  info.store_id = by_store_.empty() ? 1 : by_store_.rbegin()->first + 1;
  KVC_CHECK(info.store_id != 0) << "the registry has used every storage id";
  if (ids_ == NamespaceIds::kDerived) {
    info.id = DerivedNamespaceId(info.tenant, info.root);
    if (auto it = by_id_.find({info.tenant, info.id}); it != by_id_.end()) {
      // Two of this tenant's namespaces on one 31-bit id (about n²/2³² for its n
      // namespaces): refuse rather than let the nodes of a cluster disagree on which one the
      // id names. Only the tenant's own namespaces can collide, so naming the model tells it
      // nothing it does not know.
      return absl::AlreadyExistsError(
          absl::StrCat("namespace id ", info.id, " derived for model ", info.model_id,
                       " is already your namespace of model ", by_store_.at(it->second).model_id,
                       "; register under another model_id or chunk size"));
    }
  } else {
    info.id = info.store_id;
  }
  const std::string line = ToJson(info).dump() + "\n";
  const size_t held = bytes_per_tenant_[info.tenant];
  if (limits_.max_bytes_per_tenant > 0 && held + line.size() > limits_.max_bytes_per_tenant) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant ", info.tenant, "'s namespaces take ", held,
                     " bytes of the registry and this one ", line.size(), " more; the limit is ",
                     limits_.max_bytes_per_tenant, " (kvcached --max-registry-bytes-per-tenant)"));
  }
  KVC_RETURN_IF_ERROR(Append(line));
  by_store_[info.store_id] = info;
  by_id_[{info.tenant, info.id}] = info.store_id;
  by_root_[{info.tenant, info.root}] = info.store_id;
  ++per_tenant_[info.tenant];
  bytes_per_tenant_[info.tenant] = held + line.size();
  return info;
}

std::optional<NamespaceInfo> NamespaceRegistry::Get(uint32_t id, const std::string& tenant) const {
  MutexLock lk(mu_);
  auto it = by_id_.find({tenant, id});
  if (it == by_id_.end()) return std::nullopt;
  return by_store_.at(it->second);
}

std::vector<NamespaceInfo> NamespaceRegistry::All() const {
  MutexLock lk(mu_);
  std::vector<NamespaceInfo> out;
  out.reserve(by_store_.size());
  for (const auto& [store_id, info] : by_store_) out.push_back(info);
  return out;
}

}  // namespace kvc::cachesvc
