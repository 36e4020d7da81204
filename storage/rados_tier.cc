#include "storage/rados_tier.h"

#include <rados/librados.hpp>

#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/slot_format.h"

namespace kvc::storage {
namespace {

constexpr char kMetaXattr[] = "kvc.meta";
constexpr char kChainXattr[] = "kvc.chain";
constexpr uint8_t kMetaVersion = 2;  // 2: the namespace as a 64-bit shared tag

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

std::string EncodeMeta(SharedTag ns, uint64_t payload_bytes, uint64_t checksum) {
  std::string out;
  Append(&out, kMetaVersion);
  Append(&out, ns);
  Append(&out, payload_bytes);
  Append(&out, checksum);
  return out;
}

std::string EncodeChain(const SharedChunk& c) {
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

bool DecodeChain(std::string_view in, SharedChunk* c) {
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

namespace {

// A batch's completions: each waited for, then released (also on an early return).
class Completions {
 public:
  Completions() = default;
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;
  ~Completions() {
    for (librados::AioCompletion* c : all_) {
      c->wait_for_complete();  // an operation issued must end before its buffers go
      c->release();
    }
  }
  librados::AioCompletion* New() {
    all_.push_back(librados::Rados::aio_create_completion());
    return all_.back();
  }
  // Waits for the i-th, then its return value.
  int Wait(size_t i) {
    all_[i]->wait_for_complete();
    return all_[i]->get_return_value();
  }

 private:
  std::vector<librados::AioCompletion*> all_;
};

}  // namespace

std::vector<absl::Status> RadosTier::PutMany(std::span<const SharedPut> puts) {
  std::vector<absl::Status> status(puts.size());
  std::vector<librados::ObjectWriteOperation> ops(puts.size());
  Completions done;
  std::vector<int> issued(puts.size(), 0);
  for (size_t i = 0; i < puts.size(); ++i) {
    const SharedPut& p = puts[i];
    // One copy into the write's buffer, hashed as it is copied: the checksum kept beside
    // the bytes is of the bytes sent.
    ceph::bufferptr bytes = ceph::buffer::create(p.payload.size());
    const uint64_t checksum = p.payload.CopyWithChecksum(reinterpret_cast<uint8_t*>(bytes.c_str()));
    librados::bufferlist data, meta_bl, chain_bl;
    data.push_back(std::move(bytes));
    meta_bl.append(EncodeMeta(p.meta.namespace_tag, p.payload.size(), checksum));
    chain_bl.append(EncodeChain(p.meta));
    // One operation: the bytes and what checks them land together or not at all.
    ops[i].write_full(data);
    ops[i].setxattr(kMetaXattr, meta_bl);
    ops[i].setxattr(kChainXattr, chain_bl);
    issued[i] = impl_->io.aio_operate(ObjectName(p.key), done.New(), &ops[i]);
  }
  for (size_t i = 0; i < puts.size(); ++i) {
    const int rc = issued[i] < 0 ? issued[i] : done.Wait(i);
    status[i] =
        FromRados(rc, absl::StrCat("writing ", puts[i].key.Hex(), " to pool ", impl_->pool));
  }
  return status;
}

namespace {

// What a read brought back, checked: the chunk of namespace `ns`, `out.size()` bytes,
// matching its checksum.
absl::Status CheckRead(SharedTag ns, const std::string& where, librados::bufferlist& data,
                       const std::map<std::string, librados::bufferlist>& attrs,
                       std::span<uint8_t> out, SharedChunk* meta) {
  auto m = attrs.find(kMetaXattr);
  if (m == attrs.end()) return absl::DataLossError(absl::StrCat(where, " has no ", kMetaXattr));
  const std::string meta_bytes = m->second.to_str();
  std::string_view in(meta_bytes);
  uint8_t version = 0;
  SharedTag stored_ns = 0;
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
    *meta = SharedChunk();
    meta->namespace_tag = stored_ns;
    meta->payload_checksum = checksum;
    auto c = attrs.find(kChainXattr);
    if (c != attrs.end() && !DecodeChain(c->second.to_str(), meta))
      return absl::DataLossError(absl::StrCat(where, ": ", kChainXattr, " does not decode"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<absl::Status> RadosTier::GetMany(SharedTag ns, std::span<const ChunkKey> keys,
                                             std::span<const std::span<uint8_t>> outs,
                                             std::vector<SharedChunk>* metas) {
  std::vector<absl::Status> status(keys.size());
  if (metas != nullptr) metas->assign(keys.size(), SharedChunk());
  struct Read {
    librados::ObjectReadOperation op;
    librados::bufferlist data;
    std::map<std::string, librados::bufferlist> attrs;
    int read_rc = 0, attrs_rc = 0, issued = 0;
  };
  std::vector<Read> reads(keys.size());
  Completions done;
  for (size_t i = 0; i < keys.size(); ++i) {
    Read& r = reads[i];
    r.op.read(0, outs[i].size() + 1, &r.data, &r.read_rc);  // one byte more: a longer object shows
    r.op.getxattrs(&r.attrs, &r.attrs_rc);
    r.issued = impl_->io.aio_operate(ObjectName(keys[i]), done.New(), &r.op, nullptr);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    Read& r = reads[i];
    const int rc = r.issued < 0 ? r.issued : done.Wait(i);
    const std::string where = absl::StrCat("chunk ", keys[i].Hex(), " in pool ", impl_->pool);
    if (rc == -ENOENT) {
      status[i] = absl::NotFoundError(absl::StrCat(where, " is not stored"));
    } else if (rc < 0 || r.read_rc < 0) {
      status[i] = FromRados(rc < 0 ? rc : r.read_rc, absl::StrCat("reading ", where));
    } else if (r.attrs_rc < 0) {
      status[i] = FromRados(r.attrs_rc, absl::StrCat("reading the xattrs of ", where));
    } else {
      status[i] =
          CheckRead(ns, where, r.data, r.attrs, outs[i], metas != nullptr ? &(*metas)[i] : nullptr);
    }
  }
  return status;
}

std::vector<absl::StatusOr<bool>> RadosTier::ContainsMany(std::span<const ChunkKey> keys) {
  std::vector<absl::StatusOr<bool>> found(keys.size(), false);
  std::vector<uint64_t> sizes(keys.size());
  std::vector<time_t> mtimes(keys.size());
  std::vector<int> issued(keys.size());
  Completions done;
  for (size_t i = 0; i < keys.size(); ++i)
    issued[i] = impl_->io.aio_stat(ObjectName(keys[i]), done.New(), &sizes[i], &mtimes[i]);
  for (size_t i = 0; i < keys.size(); ++i) {
    const int rc = issued[i] < 0 ? issued[i] : done.Wait(i);
    if (rc == -ENOENT) {
      found[i] = false;
    } else if (rc < 0) {
      found[i] = FromRados(rc, absl::StrCat("stat of ", keys[i].Hex()));
    } else {
      found[i] = true;
    }
  }
  return found;
}

std::vector<absl::Status> RadosTier::RemoveMany(std::span<const ChunkKey> keys) {
  std::vector<absl::Status> status(keys.size());
  std::vector<int> issued(keys.size());
  Completions done;
  for (size_t i = 0; i < keys.size(); ++i)
    issued[i] = impl_->io.aio_remove(ObjectName(keys[i]), done.New());
  for (size_t i = 0; i < keys.size(); ++i) {
    const int rc = issued[i] < 0 ? issued[i] : done.Wait(i);
    status[i] = FromRados(rc, absl::StrCat("removing ", keys[i].Hex(), " from pool ", impl_->pool));
  }
  return status;
}

absl::Status RadosTier::Put(const ChunkKey& key, const RadosChunk& meta,
                            std::span<const uint8_t> payload) {
  const SharedPut put{key, meta, payload};
  return PutMany(std::span(&put, 1))[0];
}

absl::Status RadosTier::Get(SharedTag ns, const ChunkKey& key, std::span<uint8_t> out,
                            RadosChunk* meta) {
  std::vector<SharedChunk> metas;
  const std::span<uint8_t> outs[] = {out};
  absl::Status s = GetMany(ns, std::span(&key, 1), outs, meta != nullptr ? &metas : nullptr)[0];
  if (s.ok() && meta != nullptr) *meta = metas[0];
  return s;
}

absl::StatusOr<bool> RadosTier::Contains(const ChunkKey& key) {
  return ContainsMany(std::span(&key, 1))[0];
}

absl::Status RadosTier::Remove(const ChunkKey& key) {
  absl::Status s = RemoveMany(std::span(&key, 1))[0];
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

}  // namespace kvc::storage
