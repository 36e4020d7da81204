#include "storage/rados_tier.h"

#include <rados/librados.hpp>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "storage/slot_format.h"

namespace kvc::storage {
namespace {

constexpr char kMetaXattr[] = "kvc.meta";
constexpr char kChainXattr[] = "kvc.chain";
constexpr uint8_t kMetaVersion = 1;

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);  // little-endian hosts only
}
void AppendKey(std::string* out, const ChunkKey& k) {
  out->append(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}
template <typename T>
bool Take(std::string_view* in, T* v) {
  if (in->size() < sizeof *v) return false;
  std::memcpy(v, in->data(), sizeof *v);
  in->remove_prefix(sizeof *v);
  return true;
}
bool TakeKey(std::string_view* in, ChunkKey* k) {
  if (in->size() < k->bytes.size()) return false;
  std::memcpy(k->bytes.data(), in->data(), k->bytes.size());
  in->remove_prefix(k->bytes.size());
  return true;
}

std::string EncodeMeta(NamespaceId ns, uint64_t payload_bytes, uint64_t checksum) {
  std::string out;
  Append(&out, kMetaVersion);
  Append(&out, ns);
  Append(&out, payload_bytes);
  Append(&out, checksum);
  return out;
}

std::string EncodeChain(const RadosChunk& c) {
  std::string out;
  const uint8_t flags =
      (c.parent ? 1 : 0) | (c.origin ? 2 : 0) | (c.origin && c.origin->parent ? 4 : 0);
  Append(&out, flags);
  if (c.parent) AppendKey(&out, *c.parent);
  if (c.origin) {
    AppendKey(&out, c.origin->key);
    if (c.origin->parent) AppendKey(&out, *c.origin->parent);
  }
  Append(&out, c.expires_s);
  return out;
}

bool DecodeChain(std::string_view in, RadosChunk* c) {
  uint8_t flags = 0;
  if (!Take(&in, &flags)) return false;
  if (flags & 1) {
    c->parent.emplace();
    if (!TakeKey(&in, &*c->parent)) return false;
  }
  if (flags & 2) {
    c->origin.emplace();
    if (!TakeKey(&in, &c->origin->key)) return false;
    if (flags & 4) {
      c->origin->parent.emplace();
      if (!TakeKey(&in, &*c->origin->parent)) return false;
    }
  }
  return Take(&in, &c->expires_s) && in.empty();
}

absl::Status FromRados(int rc, const std::string& what) {
  if (rc >= 0) return absl::OkStatus();
  const std::string msg = absl::StrCat("RADOS ", what, ": ", std::strerror(-rc));
  switch (-rc) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case ETIMEDOUT:
      return absl::DeadlineExceededError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

}  // namespace

struct RadosTier::Impl {
  librados::Rados cluster;
  librados::IoCtx io;
  std::string pool;
};

RadosTier::RadosTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RadosTier::~RadosTier() {
  impl_->io.close();
  impl_->cluster.shutdown();
}

std::string RadosTier::ObjectName(const ChunkKey& key) { return "chunk-" + key.Hex(); }

absl::StatusOr<std::unique_ptr<RadosTier>> RadosTier::Connect(const RadosTierOptions& o) {
  if (o.pool.empty()) return absl::InvalidArgumentError("no RADOS pool named");
  auto impl = std::make_unique<Impl>();
  impl->pool = o.pool;
  const std::string who = absl::StrCat("client.", o.user);
  if (int rc = impl->cluster.init2(who.c_str(), "ceph", 0); rc < 0)
    return FromRados(rc, absl::StrCat("init as ", who));
  if (int rc = impl->cluster.conf_read_file(o.conf_file.empty() ? nullptr : o.conf_file.c_str());
      rc < 0)
    return FromRados(rc, absl::StrCat("reading ", o.conf_file.empty() ? "ceph.conf" : o.conf_file));
  // Bounded waits: a monitor or OSD that is gone or stopped fails the call, never hangs it.
  for (const auto& [name, value] : {std::pair{"client_mount_timeout", o.connect_timeout_s},
                                    std::pair{"rados_mon_op_timeout", o.op_timeout_s},
                                    std::pair{"rados_osd_op_timeout", o.op_timeout_s}}) {
    const std::string v = std::to_string(value);
    if (int rc = impl->cluster.conf_set(name, v.c_str()); rc < 0)
      return FromRados(rc, absl::StrCat("setting ", name));
  }
  if (int rc = impl->cluster.connect(); rc < 0) return FromRados(rc, "connecting to the cluster");
  if (int rc = impl->cluster.ioctx_create(o.pool.c_str(), impl->io); rc < 0) {
    if (rc == -ENOENT)
      return absl::NotFoundError(absl::StrCat("RADOS pool ", o.pool, " does not exist"));
    return FromRados(rc, absl::StrCat("opening pool ", o.pool));
  }
  return std::unique_ptr<RadosTier>(new RadosTier(std::move(impl)));
}

absl::Status RadosTier::Put(const ChunkKey& key, const RadosChunk& meta,
                            std::span<const uint8_t> payload) {
  librados::bufferlist data, meta_bl, chain_bl;
  data.append(reinterpret_cast<const char*>(payload.data()), payload.size());
  meta_bl.append(EncodeMeta(meta.namespace_id, payload.size(), meta.payload_checksum));
  chain_bl.append(EncodeChain(meta));
  // One operation: the bytes and what checks them land together or not at all.
  librados::ObjectWriteOperation op;
  op.write_full(data);
  op.setxattr(kMetaXattr, meta_bl);
  op.setxattr(kChainXattr, chain_bl);
  return FromRados(impl_->io.operate(ObjectName(key), &op), absl::StrCat("writing ", key.Hex()));
}

absl::Status RadosTier::Get(NamespaceId ns, const ChunkKey& key, std::span<uint8_t> out,
                            RadosChunk* meta) {
  librados::bufferlist data;
  std::map<std::string, librados::bufferlist> attrs;
  int read_rc = 0, attrs_rc = 0;
  librados::ObjectReadOperation op;
  op.read(0, out.size() + 1, &data, &read_rc);  // one byte more: a longer object shows
  op.getxattrs(&attrs, &attrs_rc);
  const std::string where = absl::StrCat("chunk ", key.Hex(), " in pool ", impl_->pool);
  int rc = impl_->io.operate(ObjectName(key), &op, nullptr);
  if (rc == -ENOENT) return absl::NotFoundError(absl::StrCat(where, " is not stored"));
  if (rc < 0) return FromRados(rc, absl::StrCat("reading ", where));
  if (read_rc < 0) return FromRados(read_rc, absl::StrCat("reading ", where));
  if (attrs_rc < 0) return FromRados(attrs_rc, absl::StrCat("reading the xattrs of ", where));
  auto m = attrs.find(kMetaXattr);
  if (m == attrs.end()) return absl::DataLossError(absl::StrCat(where, " has no ", kMetaXattr));
  const std::string meta_bytes = m->second.to_str();
  std::string_view in(meta_bytes);
  uint8_t version = 0;
  NamespaceId stored_ns = 0;
  uint64_t stored_bytes = 0, checksum = 0;
  if (!Take(&in, &version) || version != kMetaVersion || !Take(&in, &stored_ns) ||
      !Take(&in, &stored_bytes) || !Take(&in, &checksum) || !in.empty())
    return absl::DataLossError(absl::StrCat(where, ": ", kMetaXattr, " does not decode"));
  // Never another namespace's bytes, nor bytes of another size or that do not verify.
  if (stored_ns != ns)
    return absl::NotFoundError(absl::StrCat(where, " belongs to another namespace"));
  if (stored_bytes != out.size() || data.length() != out.size())
    return absl::DataLossError(absl::StrCat(where, " holds ", data.length(), " bytes (",
                                            stored_bytes, " recorded), not ", out.size()));
  data.begin().copy(out.size(), reinterpret_cast<char*>(out.data()));
  if (PayloadChecksum(out) != checksum)
    return absl::DataLossError(absl::StrCat(where, " does not match its checksum"));
  if (meta != nullptr) {
    *meta = RadosChunk();
    meta->namespace_id = stored_ns;
    meta->payload_checksum = checksum;
    auto c = attrs.find(kChainXattr);
    if (c != attrs.end() && !DecodeChain(c->second.to_str(), meta))
      return absl::DataLossError(absl::StrCat(where, ": ", kChainXattr, " does not decode"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RadosTier::Contains(const ChunkKey& key) {
  uint64_t size = 0;
  time_t mtime = 0;
  const int rc = impl_->io.stat(ObjectName(key), &size, &mtime);
  if (rc == -ENOENT) return false;
  if (rc < 0) return FromRados(rc, absl::StrCat("stat of ", key.Hex()));
  return true;
}

absl::Status RadosTier::Remove(const ChunkKey& key) {
  const int rc = impl_->io.remove(ObjectName(key));
  if (rc == -ENOENT) return absl::OkStatus();
  return FromRados(rc, absl::StrCat("removing ", key.Hex()));
}

}  // namespace kvc::storage
