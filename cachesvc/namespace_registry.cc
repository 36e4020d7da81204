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
    n.id = e.at("id");
    n.tenant = e.at("tenant");
    n.model_id = e.at("model_id");
    n.chunk_tokens = e.at("chunk_tokens");
    n.chunk_bytes = e.at("chunk_bytes");
    n.vocab_size = e.at("vocab_size");
    if (!FromHex(e.at("root_key"), &n.root)) throw std::runtime_error("root_key");
    n.key_scope = e.value("key_scope", 0u);  // absent: registered before keys were bound
    if (n.key_scope > kKeyScopeBound) throw std::runtime_error("key_scope");
    n.key_mode = e.value("key_mode", kKeysFromTokens);  // absent: before caller keys
    if (n.key_mode > kKeysFromCaller) throw std::runtime_error("key_mode");
  } catch (const std::exception& ex) {
    return absl::DataLossError(
        absl::StrCat(where, ": bad namespace entry ", e.dump(), ": ", ex.what()));
  }
  return n;
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

absl::Status SyncDir(const std::string& dir) {
  const int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return Errno("open " + dir);
  const int rc = fsync(d);
  close(d);
  return rc == 0 ? absl::OkStatus() : Errno("fsync " + dir);
}

absl::Status WriteAll(int fd, const std::string& text, const std::string& path) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("write " + path);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

storage::ChunkKey StorageKey(const NamespaceInfo& ns, const storage::ChunkKey& key) {
  return ns.key_scope == kKeyScopeBound ? client::BoundChunkKey(ns.root, key) : key;
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

absl::StatusOr<std::unique_ptr<NamespaceRegistry>> NamespaceRegistry::Open(
    const std::string& data_dir, size_t max_per_tenant, NamespaceIds ids) {
  std::unique_ptr<NamespaceRegistry> r(new NamespaceRegistry(data_dir, max_per_tenant, ids));
  KVC_RETURN_IF_ERROR(r->Load());
  return r;
}

NamespaceRegistry::~NamespaceRegistry() {
  if (fd_ >= 0) close(fd_);
}

absl::Status NamespaceRegistry::Load() {
  const std::string log = dir_ + kLog, old = dir_ + kOldArray;
  std::vector<NamespaceInfo> entries;
  size_t good_bytes = 0;  // the log's length up to its last whole line
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
      KVC_ASSIGN_OR_RETURN(NamespaceInfo e, FromJson(j, absl::StrCat(log, ":", n)));
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
      KVC_ASSIGN_OR_RETURN(NamespaceInfo n, FromJson(e, old));
      entries.push_back(n);
    }
    std::string lines;
    for (const NamespaceInfo& n : entries) lines += ToJson(n).dump() + "\n";
    const std::string tmp = log + ".tmp";
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Errno("open " + tmp);
    absl::Status w = WriteAll(fd, lines, tmp);
    if (w.ok() && fsync(fd) != 0) w = Errno("fsync " + tmp);
    close(fd);
    if (!w.ok()) return w;
    if (rename(tmp.c_str(), log.c_str()) != 0) return Errno("rename " + tmp);
    KVC_RETURN_IF_ERROR(SyncDir(dir_));
    unlink(old.c_str());
    good_bytes = lines.size();
  }
  for (const NamespaceInfo& n : entries) {
    by_id_[n.id] = n;
    by_root_[{n.tenant, n.root}] = n.id;
    ++per_tenant_[n.tenant];
  }
  fd_ = open(log.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) return Errno("open " + log);
  // Drop a torn tail, so the next entry starts on a line of its own.
  if (ftruncate(fd_, static_cast<off_t>(good_bytes)) != 0) return Errno("truncate " + log);
  if (lseek(fd_, 0, SEEK_END) < 0) return Errno("seek " + log);
  return absl::OkStatus();
}

absl::Status NamespaceRegistry::Append(const NamespaceInfo& n) {
  const std::string log = dir_ + kLog;
  const off_t before = lseek(fd_, 0, SEEK_END);
  absl::Status s = WriteAll(fd_, ToJson(n).dump() + "\n", log);
  if (s.ok() && fdatasync(fd_) != 0) s = Errno("fdatasync " + log);
  if (!s.ok() && before >= 0) {
    (void)ftruncate(fd_, before);  // a failed append must not leave half a line
    (void)lseek(fd_, before, SEEK_SET);
  }
  // The log's first line also needs its directory entry to be durable.
  if (s.ok() && before == 0) s = SyncDir(dir_);
  return s;
}

absl::StatusOr<NamespaceInfo> NamespaceRegistry::FindOrAdd(NamespaceInfo info) {
  std::lock_guard lk(mu_);
  if (auto it = by_root_.find({info.tenant, info.root}); it != by_root_.end()) {
    return by_id_.at(it->second);
  }
  if (max_per_tenant_ > 0 && per_tenant_[info.tenant] >= max_per_tenant_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tenant ", info.tenant, " has registered ", per_tenant_[info.tenant],
        " namespaces; the limit is ", max_per_tenant_, " (kvcached --max-namespaces-per-tenant)"));
  }
  if (ids_ == NamespaceIds::kDerived) {
    info.id = DerivedNamespaceId(info.tenant, info.root);
    if (auto it = by_id_.find(info.id); it != by_id_.end()) {
      // Two namespaces on one 31-bit id (about n²/2³² for n namespaces): refuse rather
      // than let the nodes of a cluster disagree on which one an id names. (The message
      // names neither the other namespace's tenant nor its model: they are not the
      // caller's to know.)
      return absl::AlreadyExistsError(
          absl::StrCat("namespace id ", info.id, " derived for model ", info.model_id,
                       " is already taken by another namespace; register under another "
                       "model_id or chunk size"));
    }
  } else {
    info.id = by_id_.empty() ? 1 : by_id_.rbegin()->first + 1;
  }
  KVC_RETURN_IF_ERROR(Append(info));
  by_id_[info.id] = info;
  by_root_[{info.tenant, info.root}] = info.id;
  ++per_tenant_[info.tenant];
  return info;
}

std::optional<NamespaceInfo> NamespaceRegistry::Get(uint32_t id, const std::string& tenant) const {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.tenant != tenant) return std::nullopt;
  return it->second;
}

std::vector<NamespaceInfo> NamespaceRegistry::All() const {
  std::lock_guard lk(mu_);
  std::vector<NamespaceInfo> out;
  out.reserve(by_id_.size());
  for (const auto& [id, info] : by_id_) out.push_back(info);
  return out;
}

}  // namespace kvc::cachesvc
