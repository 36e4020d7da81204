#include "cachesvc/namespace_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvc::cachesvc {
namespace {

std::string Hex(const storage::ChunkKey& k) { return k.Hex(); }

bool FromHex(const std::string& s, storage::ChunkKey* k) {
  if (s.size() != 32) return false;
  for (size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    k->bytes[i] = static_cast<uint8_t>(v);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NamespaceRegistry>> NamespaceRegistry::Open(
    const std::string& data_dir) {
  std::unique_ptr<NamespaceRegistry> r(new NamespaceRegistry(data_dir + "/namespaces.json"));
  std::ifstream in(r->path_);
  if (!in) return r;  // none yet
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::DataLossError(absl::StrCat(r->path_, " is not a JSON array of namespaces"));
  }
  for (const auto& e : j) {
    NamespaceInfo n;
    try {
      n.id = e.at("id");
      n.tenant = e.at("tenant");
      n.model_id = e.at("model_id");
      n.chunk_tokens = e.at("chunk_tokens");
      n.chunk_bytes = e.at("chunk_bytes");
      n.vocab_size = e.at("vocab_size");
      if (!FromHex(e.at("root_key"), &n.root)) throw std::runtime_error("root_key");
    } catch (const std::exception& ex) {
      return absl::DataLossError(
          absl::StrCat(r->path_, ": bad namespace entry ", e.dump(), ": ", ex.what()));
    }
    r->by_id_[n.id] = n;
  }
  return r;
}

absl::Status NamespaceRegistry::Save() const {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [id, n] : by_id_) {
    j.push_back({{"id", n.id},
                 {"tenant", n.tenant},
                 {"model_id", n.model_id},
                 {"chunk_tokens", n.chunk_tokens},
                 {"chunk_bytes", n.chunk_bytes},
                 {"vocab_size", n.vocab_size},
                 {"root_key", Hex(n.root)}});
  }
  const std::string tmp = path_ + ".tmp", text = j.dump(1);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", tmp, ": ", strerror(errno)));
  const bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("write ", path_, ": ", strerror(errno)));
  }
  const std::string dir = path_.substr(0, path_.rfind('/'));
  if (const int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    fsync(d);
    close(d);
  }
  return absl::OkStatus();
}

absl::StatusOr<NamespaceInfo> NamespaceRegistry::FindOrAdd(NamespaceInfo info) {
  std::lock_guard lk(mu_);
  for (const auto& [id, n] : by_id_) {
    if (n.tenant == info.tenant && n.root == info.root) return n;
  }
  info.id = by_id_.empty() ? 1 : by_id_.rbegin()->first + 1;
  by_id_[info.id] = info;
  if (absl::Status s = Save(); !s.ok()) {
    by_id_.erase(info.id);
    return s;
  }
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
