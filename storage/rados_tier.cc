#include "storage/rados_tier.h"

#include <rados/librados.hpp>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/slot_format.h"
#include "storage/xxh3.h"

namespace kvc::storage {
namespace {

constexpr char kMetaXattr[] = "kvc.meta";
constexpr char kChainXattr[] = "kvc.chain";
constexpr char kAccountXattr[] = "kvc.account";  // on a chunk and on its account's usage object
constexpr char kBytesXattr[] = "kvc.bytes";      // a usage object's count, decimal
constexpr char kChunkPrefix[] = "chunk-";
constexpr size_t kSweepBatch = 256;    // objects a sweep reads (and removes) together
constexpr int kChargeAttempts = 1000;  // compare-and-swap rounds before a count gives up
constexpr uint8_t kMetaVersion = 2;    // 2: the namespace as a 64-bit shared tag

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

std::string RadosTier::ObjectName(const ChunkKey& key) { return kChunkPrefix + key.Hex(); }

std::string RadosTier::UsageObjectName(const std::string& account) {
  return absl::StrCat("usage-",
                      absl::Hex(Xxh3Hash(account.data(), account.size()), absl::kZeroPad16));
}

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
  struct Write {
    librados::bufferlist data, meta, chain, account;
    // Kept until they complete: the create, the renewal, the rewrite.
    librados::ObjectWriteOperation ops[3];
    int issued = 0, rc = 0;
  };
  std::vector<Write> writes(puts.size());
  enum Step { kCreate, kRenew, kRewrite };
  // kCreate: the bytes and what checks them in one exclusive create — only the write that
  // creates the object counts its bytes. kRenew, for an object there already (another
  // owner's write, an earlier one of this chunk): if it holds these very bytes (its
  // kvc.meta, with their checksum, compares equal) only its expiry and account are written
  // — the payload crosses the network once however many owners store the chunk. kRewrite:
  // it holds something else (an older format): replaced whole, in one operation.
  auto issue = [&](size_t i, Step step, Completions& done) {
    Write& w = writes[i];
    librados::ObjectWriteOperation& op = w.ops[step];
    if (step == kCreate) op.create(true);
    if (step == kRenew) {
      op.cmpxattr(kMetaXattr, LIBRADOS_CMPXATTR_OP_EQ, w.meta);  // ECANCELED if not
    } else {
      op.write_full(w.data);
      op.setxattr(kMetaXattr, w.meta);
    }
    op.setxattr(kChainXattr, w.chain);
    if (w.account.length() > 0) op.setxattr(kAccountXattr, w.account);
    w.issued = impl_->io.aio_operate(ObjectName(puts[i].key), done.New(), &op);
  };
  // Issues `step` for the writes listed, and waits for them.
  auto run = [&](const std::vector<size_t>& which, Step step) {
    Completions done;
    for (size_t i : which) issue(i, step, done);
    for (size_t j = 0; j < which.size(); ++j) {
      Write& w = writes[which[j]];
      w.rc = w.issued < 0 ? w.issued : done.Wait(j);
    }
  };
  std::vector<size_t> all(puts.size());
  for (size_t i = 0; i < puts.size(); ++i) {
    all[i] = i;
    const SharedPut& p = puts[i];
    Write& w = writes[i];
    // One copy into the write's buffer, hashed as it is copied: the checksum kept beside
    // the bytes is of the bytes sent.
    ceph::bufferptr bytes = ceph::buffer::create(p.payload.size());
    const uint64_t checksum = p.payload.CopyWithChecksum(reinterpret_cast<uint8_t*>(bytes.c_str()));
    w.data.push_back(std::move(bytes));
    w.meta.append(EncodeMeta(p.meta.namespace_tag, p.payload.size(), checksum));
    w.chain.append(EncodeChain(p.meta));
    w.account.append(p.meta.account);
  }
  run(all, kCreate);
  std::map<std::string, int64_t> created;  // account → bytes of the objects created
  std::vector<size_t> renew, rewrite;
  for (size_t i = 0; i < puts.size(); ++i) {
    if (writes[i].rc == -EEXIST) {
      renew.push_back(i);
    } else if (writes[i].rc >= 0 && !puts[i].meta.account.empty()) {
      created[puts[i].meta.account] += static_cast<int64_t>(puts[i].payload.size());
    }
  }
  if (!renew.empty()) run(renew, kRenew);
  for (size_t i : renew) {
    if (writes[i].rc == -ECANCELED) rewrite.push_back(i);
  }
  if (!rewrite.empty()) run(rewrite, kRewrite);
  for (size_t i = 0; i < puts.size(); ++i) {
    status[i] = FromRados(writes[i].rc,
                          absl::StrCat("writing ", puts[i].key.Hex(), " to pool ", impl_->pool));
  }
  // The objects are stored: a count that fails leaves the account short by them (the
  // status of the writes does not change — their bytes are durable).
  for (const auto& [account, bytes] : created) (void)Charge(account, bytes);
  return status;
}

// The count in an account's usage object: nullopt when the object does not exist yet, 0
// when it exists without a count.
absl::StatusOr<std::optional<uint64_t>> RadosTier::ReadUsage(const std::string& account) {
  librados::bufferlist current;
  const int got = impl_->io.getxattr(UsageObjectName(account), kBytesXattr, current);
  if (got == -ENOENT) return std::nullopt;
  if (got == -ENODATA) return 0;
  if (got < 0) return FromRados(got, absl::StrCat("reading the usage of ", account));
  uint64_t bytes = 0;
  if (!absl::SimpleAtoi(current.to_str(), &bytes)) {
    return absl::DataLossError(absl::StrCat("the usage of ", account, " reads \"", current.to_str(),
                                            "\", not a count of bytes"));
  }
  return bytes;
}

absl::Status RadosTier::Charge(const std::string& account, int64_t delta) {
  const std::string oid = UsageObjectName(account);
  for (int attempt = 0; attempt < kChargeAttempts; ++attempt) {
    KVC_ASSIGN_OR_RETURN(const std::optional<uint64_t> current, ReadUsage(account));
    if (!current && delta <= 0) return absl::OkStatus();  // nothing counted yet
    const uint64_t old = current.value_or(0);
    const uint64_t next = delta >= 0 ? old + static_cast<uint64_t>(delta)
                                     : old - std::min(old, static_cast<uint64_t>(-delta));
    librados::ObjectWriteOperation op;
    librados::bufferlist value;
    value.append(std::to_string(next));
    if (!current) {
      librados::bufferlist name;
      name.append(account);
      op.create(true);  // fails (EEXIST) if another writer made it first: read again
      op.setxattr(kAccountXattr, name);
    } else {
      op.cmpxattr(kBytesXattr, LIBRADOS_CMPXATTR_OP_EQ, old);  // ECANCELED if it moved
    }
    op.setxattr(kBytesXattr, value);
    const int rc = impl_->io.operate(oid, &op);
    if (rc >= 0) return absl::OkStatus();
    if (rc != -EEXIST && rc != -ECANCELED)
      return FromRados(rc, absl::StrCat("counting the usage of ", account));
  }
  return absl::AbortedError(
      absl::StrCat("the usage of ", account, " kept changing (", kChargeAttempts, " attempts)"));
}

absl::StatusOr<uint64_t> RadosTier::AccountBytes(const std::string& account) {
  KVC_ASSIGN_OR_RETURN(const std::optional<uint64_t> current, ReadUsage(account));
  return current.value_or(0);
}

namespace {

// What a read brought back, checked: the chunk of namespace `ns`, `out.size()` bytes,
// matching its checksum.
// `damaged`: set when the object does not match what is kept beside it (not when the
// reader expected another size).
absl::Status CheckRead(SharedTag ns, const std::string& where, librados::bufferlist& data,
                       const std::map<std::string, librados::bufferlist>& attrs,
                       std::span<uint8_t> out, SharedChunk* meta, bool* damaged) {
  *damaged = true;
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
  *damaged = false;
  if (stored_ns != ns)
    return absl::NotFoundError(absl::StrCat(where, " belongs to another namespace"));
  if (stored_bytes != out.size() || data.length() != out.size()) {
    // (Read: up to one byte more than asked. Asked at least the recorded size, a length
    // other than that is the object's own; asked less, the reader is the one mistaken.)
    *damaged = out.size() >= stored_bytes && data.length() != stored_bytes;
    return absl::DataLossError(absl::StrCat(where, " holds ", data.length(), " bytes (",
                                            stored_bytes, " recorded), not ", out.size()));
  }
  data.begin().copy(out.size(), reinterpret_cast<char*>(out.data()));
  if (PayloadChecksum(out) != checksum) {
    *damaged = true;
    return absl::DataLossError(absl::StrCat(where, " does not match its checksum"));
  }
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
  std::vector<std::string> damaged;
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
      bool bad = false;
      status[i] = CheckRead(ns, where, r.data, r.attrs, outs[i],
                            metas != nullptr ? &(*metas)[i] : nullptr, &bad);
      if (bad) damaged.push_back(ObjectName(keys[i]));
    }
  }
  // A damaged object is removed (it is never served): the next durable store of the chunk
  // creates it again, where a renewal would have kept the damage.
  if (!damaged.empty()) (void)RemoveObjects(damaged);
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
  std::vector<std::string> names;
  for (const ChunkKey& k : keys) names.push_back(ObjectName(k));
  return RemoveObjects(names);
}

std::vector<absl::Status> RadosTier::RemoveObjects(std::span<const std::string> names) {
  std::vector<absl::Status> status(names.size());
  // Each object's size and account first (to take its bytes off the count), then the
  // removes; only a remove that deletes the object counts (two nodes removing one object
  // take its bytes off once).
  struct Seen {
    librados::ObjectReadOperation op;
    uint64_t size = 0;
    time_t mtime = 0;
    std::map<std::string, librados::bufferlist> attrs;
    int stat_rc = 0, attrs_rc = 0, issued = 0, rc = 0;
  };
  std::vector<Seen> seen(names.size());
  {
    Completions done;
    for (size_t i = 0; i < names.size(); ++i) {
      seen[i].op.stat(&seen[i].size, &seen[i].mtime, &seen[i].stat_rc);
      seen[i].op.getxattrs(&seen[i].attrs, &seen[i].attrs_rc);
      seen[i].issued = impl_->io.aio_operate(names[i], done.New(), &seen[i].op, nullptr);
    }
    for (size_t i = 0; i < names.size(); ++i)
      seen[i].rc = seen[i].issued < 0 ? seen[i].issued : done.Wait(i);
  }
  std::vector<int> issued(names.size(), 0);
  std::vector<int> removed_rc(names.size(), 0);
  {
    Completions done;
    std::vector<size_t> asked;
    for (size_t i = 0; i < names.size(); ++i) {
      if (seen[i].rc < 0) {
        removed_rc[i] = seen[i].rc;
        continue;
      }
      issued[i] = impl_->io.aio_remove(names[i], done.New());
      asked.push_back(i);
    }
    for (size_t j = 0; j < asked.size(); ++j) {
      const size_t i = asked[j];
      removed_rc[i] = issued[i] < 0 ? issued[i] : done.Wait(j);
    }
  }
  std::map<std::string, int64_t> freed;
  for (size_t i = 0; i < names.size(); ++i) {
    status[i] =
        FromRados(removed_rc[i], absl::StrCat("removing ", names[i], " from pool ", impl_->pool));
    if (removed_rc[i] < 0) continue;
    auto a = seen[i].attrs.find(kAccountXattr);
    if (a != seen[i].attrs.end() && a->second.length() > 0)
      freed[a->second.to_str()] -= static_cast<int64_t>(seen[i].size);
  }
  for (const auto& [account, bytes] : freed) (void)Charge(account, bytes);
  return status;
}

absl::StatusOr<SharedSweep> RadosTier::SweepExpired(int64_t now_s) {
  SharedSweep sweep;
  std::vector<std::string> batch;
  // Reads the expiry of each object in the batch; removes those past it.
  auto settle = [&] {
    struct Read {
      librados::ObjectReadOperation op;
      std::map<std::string, librados::bufferlist> attrs;
      int attrs_rc = 0, issued = 0;
    };
    std::vector<Read> reads(batch.size());
    std::vector<std::string> expired;
    {
      Completions done;
      for (size_t i = 0; i < batch.size(); ++i) {
        reads[i].op.getxattrs(&reads[i].attrs, &reads[i].attrs_rc);
        reads[i].issued = impl_->io.aio_operate(batch[i], done.New(), &reads[i].op, nullptr);
      }
      for (size_t i = 0; i < batch.size(); ++i) {
        const int rc = reads[i].issued < 0 ? reads[i].issued : done.Wait(i);
        if (rc == -ENOENT) continue;  // removed since it was listed
        SharedChunk meta;
        auto c = reads[i].attrs.find(kChainXattr);
        if (rc < 0 || c == reads[i].attrs.end() || !DecodeChain(c->second.to_str(), &meta)) {
          ++sweep.errors;
          continue;
        }
        if (meta.expires_s != 0 && meta.expires_s <= now_s) expired.push_back(batch[i]);
      }
    }
    sweep.listed += batch.size();
    for (const absl::Status& s : RemoveObjects(expired)) {
      if (s.ok()) {
        ++sweep.removed;
      } else if (!absl::IsNotFound(s)) {
        ++sweep.errors;
      }
    }
    batch.clear();
  };
  try {
    for (auto it = impl_->io.nobjects_begin(); it != impl_->io.nobjects_end(); ++it) {
      if (!absl::StartsWith(it->get_oid(), kChunkPrefix)) continue;  // usage objects, others'
      batch.push_back(it->get_oid());
      if (batch.size() == kSweepBatch) settle();
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("RADOS listing pool ", impl_->pool, " for expired chunks: ", e.what()));
  }
  settle();
  return sweep;
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
