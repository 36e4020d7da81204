#include "client/client.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/channel_args.h"
#include "client/prefix_hash.h"
#include "client/stats.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "wire/arena_handshake.h"
#include "wire/grpc_status.h"
#include "wire/wire.h"

namespace kvc::client {

namespace pb = ::kvcache::v1;
using storage::ChunkKey;

namespace {

using wire::KeyBytes;

// A key the server sent: one of another size is the server's fault, not the caller's.
absl::StatusOr<ChunkKey> KeyFrom(const std::string& b) {
  absl::StatusOr<ChunkKey> k = wire::KeyFrom(b, "a key the server sent");
  if (!k.ok()) return absl::DataLossError(k.status().message());
  return k;
}

template <typename Req>
void AddKeys(Req* req, std::span<const ChunkKey> keys) {
  for (const ChunkKey& k : keys) req->add_chunk_keys(KeyBytes(k));
}

// A tier the server named; one this client does not know reads as none (absent).
Tier TierFromWire(int t) {
  return t >= static_cast<int>(Tier::kNone) && t <= static_cast<int>(Tier::kRados)
             ? static_cast<Tier>(t)
             : Tier::kNone;
}

}  // namespace

struct CacheClient::Rpc {
  explicit Rpc(const std::shared_ptr<grpc::Channel>& channel)
      : stub(pb::KVCache::NewStub(channel)) {}
  std::unique_ptr<pb::KVCache::Stub> stub;
};

CacheClient::CacheClient(ClientOptions o, std::shared_ptr<grpc::Channel> ch)
    : options_(std::move(o)), channel_(std::move(ch)), rpc_(std::make_unique<Rpc>(channel_)) {}

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kNone:
      return "none";
    case Tier::kHbm:
      return "hbm";
    case Tier::kRam:
      return "ram";
    case Tier::kSsd:
      return "ssd";
    case Tier::kRados:
      return "rados";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<CacheClient>> CacheClient::Connect(const ClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty()) {
    std::ifstream in(options.tls_ca_file);
    if (!in)
      return absl::NotFoundError(absl::StrCat("cannot open CA file \"", options.tls_ca_file, "\""));
    std::stringstream ca;
    ca << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca.str();
    creds = grpc::SslCredentials(ssl);
  }
  const grpc::ChannelArguments args = DaemonChannelArguments(64 << 20, 8 << 20);
  std::unique_ptr<CacheClient> client(
      new CacheClient(options, grpc::CreateCustomChannel(options.address, creds, args)));
  if (!options.shm_socket.empty()) {
    absl::StatusOr<MappedArena> arena = MapArena(options.shm_socket, options.bearer_token);
    if (arena.ok()) {
      client->arena_ = *arena;
    } else {
      client->shm_error_ = std::string(arena.status().message());
    }
  }
  return client;
}

CacheClient::~CacheClient() {
  std::vector<uint64_t> ids;
  std::vector<MappedArena> old_arenas;
  {
    MutexLock lk(lease_mu_);
    ids = std::move(to_release_);
    for (const auto& [id, lease] : held_leases_) ids.push_back(id);
    old_arenas = std::move(old_arenas_);
  }
  for (uint64_t id : ids) {
    pb::ReleaseRefsRequest rel;
    rel.set_lease_id(id);
    pb::ReleaseRefsResponse ignored;
    (void)rpc_->stub->ReleaseRefs(Context().get(), rel, &ignored);
  }
  UnmapArena(arena_);
  for (const MappedArena& a : old_arenas) UnmapArena(a);
}

void CacheClient::RemapArena(uint64_t stale_lease, bool map_again) {
  MutexLock lk(lease_mu_);
  held_refs_.clear();
  held_leases_.clear();
  if (stale_lease != 0) to_release_.push_back(stale_lease);
  old_arenas_.push_back(arena_);
  arena_ = MappedArena{};
  if (!map_again) {  // a fresh mapping disagreed too: stop using shared memory
    shm_error_ = "the shared arena's identity does not match kvcached's answers";
    return;
  }
  absl::StatusOr<MappedArena> a = MapArena(options_.shm_socket, options_.bearer_token);
  if (a.ok()) {
    arena_ = *a;
  } else {
    shm_error_ = absl::StrCat("after a kvcached restart: ", a.status().message());
  }
}

bool CacheClient::CopyFromHeldLeases(const RemoteNamespace& ns, std::span<const ChunkKey> keys,
                                     std::span<uint8_t* const> dst) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lk(lease_mu_);
  std::vector<const HeldRef*> refs;
  refs.reserve(keys.size());
  for (const ChunkKey& key : keys) {
    auto it = held_refs_.find(key);
    if (it == held_refs_.end()) return false;
    const HeldLease& lease = held_leases_.at(it->second.lease_id);
    if (lease.usable_until <= now) return false;
    if (lease.verdict_offset != 0 && ReadVerdicts(lease.verdict_offset) != lease.verdicts) {
      // A copy in this arena was found corrupt since: perhaps one of ours. Give up every
      // held lease (the server ends them; their chunks come back with the next FetchRefs).
      for (const auto& [id, held] : held_leases_) to_release_.push_back(id);
      held_refs_.clear();
      held_leases_.clear();
      return false;
    }
    refs.push_back(&it->second);
  }
  // Copies under the lock: a lease is never released while a copy reads from it.
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint8_t* src = arena_.base + refs[i]->arena_offset;
    const HeldLease& lease = held_leases_.at(refs[i]->lease_id);
    std::memcpy(dst[i], src, ns.chunk_bytes);
    // A daemon without a verdict count: the copy itself is checked (two passes; only an
    // older kvcached takes this path).
    if (lease.verdict_offset == 0 && refs[i]->checksum != 0 &&
        XXH3_64bits(dst[i], ns.chunk_bytes) != refs[i]->checksum) {
      auto held = held_leases_.find(refs[i]->lease_id);
      if (held != held_leases_.end() && held->second.refs > 0) --held->second.refs;
      held_refs_.erase(keys[i]);
      return false;
    }
  }
  return true;
}

uint64_t CacheClient::ReadVerdicts(uint64_t offset) const {
  if (offset == 0 || arena_.base == nullptr || offset + sizeof(uint64_t) > arena_.bytes) return 0;
  // The daemon adds to it with a release store (storage/ram_arena.h).
  return std::atomic_ref<const uint64_t>(*reinterpret_cast<const uint64_t*>(arena_.base + offset))
      .load(std::memory_order_acquire);
}

std::vector<uint64_t> CacheClient::TakeLeasesToRelease() {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lk(lease_mu_);
  for (auto it = held_leases_.begin(); it != held_leases_.end();) {
    if (it->second.refs != 0 && it->second.usable_until > now) {
      ++it;
      continue;
    }
    to_release_.push_back(it->first);
    it = held_leases_.erase(it);
  }
  std::erase_if(held_refs_, [&](const auto& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lease_mu_) {
    return !held_leases_.contains(r.second.lease_id);
  });
  return std::exchange(to_release_, {});
}

void CacheClient::HoldLease(uint64_t lease_id, std::chrono::steady_clock::time_point usable_until,
                            std::span<const ChunkKey> keys, const std::vector<uint64_t>& offsets,
                            const std::vector<uint64_t>& checksums, uint64_t verdicts,
                            uint64_t verdict_offset) {
  MutexLock lk(lease_mu_);
  HeldLease& lease = held_leases_[lease_id];
  lease.usable_until = usable_until;
  lease.verdicts = verdicts;
  lease.verdict_offset = verdict_offset;
  for (size_t i = 0; i < keys.size(); ++i) {
    const HeldRef ref{lease_id, offsets[i], checksums[i]};
    auto [it, inserted] = held_refs_.try_emplace(keys[i], ref);
    if (!inserted) {  // the newer lease holds this chunk longer
      auto old = held_leases_.find(it->second.lease_id);
      if (old != held_leases_.end() && old->second.refs > 0) --old->second.refs;
      it->second = ref;
    }
    ++lease.refs;
  }
  // Bound what one client keeps out of eviction: drop the oldest leases past the limit.
  while (held_refs_.size() > options_.max_held_chunks && held_leases_.size() > 1) {
    auto oldest = held_leases_.begin();
    to_release_.push_back(oldest->first);
    std::erase_if(held_refs_, [&](const auto& r) { return r.second.lease_id == oldest->first; });
    held_leases_.erase(oldest);
  }
}

std::unique_ptr<grpc::ClientContext> CacheClient::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(options_.timeout_ms));
  if (!options_.bearer_token.empty())
    ctx->AddMetadata("authorization", "Bearer " + options_.bearer_token);
  return ctx;
}

absl::StatusOr<RemoteNamespace> CacheClient::RegisterNamespace(const std::string& model_config_json,
                                                               const std::string& model_id,
                                                               uint32_t chunk_tokens) {
  pb::RegisterNamespaceRequest req;
  req.set_model_config_json(model_config_json);
  req.set_model_id(model_id);
  req.set_chunk_tokens(chunk_tokens);
  return Register(req);
}

absl::StatusOr<RemoteNamespace> CacheClient::RegisterKeyedNamespace(const std::string& model_id,
                                                                    uint64_t page_bytes,
                                                                    uint32_t page_tokens) {
  pb::RegisterNamespaceRequest req;
  req.set_model_id(model_id);
  req.set_key_mode(pb::KEY_MODE_CALLER);
  req.set_page_bytes(page_bytes);
  req.set_chunk_tokens(page_tokens);
  KVC_ASSIGN_OR_RETURN(RemoteNamespace ns, Register(req));
  if (!ns.caller_keys) {
    return absl::FailedPreconditionError(
        "this kvcached predates caller-keyed namespaces (it registered a token-keyed one)");
  }
  return ns;
}

absl::StatusOr<RemoteNamespace> CacheClient::Register(const pb::RegisterNamespaceRequest& req) {
  pb::RegisterNamespaceResponse resp;
  KVC_RETURN_IF_ERROR(wire::FromGrpc(rpc_->stub->RegisterNamespace(Context().get(), req, &resp)));
  KVC_ASSIGN_OR_RETURN(ChunkKey root, KeyFrom(resp.root_key()));
  return RemoteNamespace{resp.namespace_id(), resp.chunk_bytes(),
                         resp.chunk_tokens(), root,
                         resp.vocab_size(),   resp.key_mode() == pb::KEY_MODE_CALLER};
}

absl::StatusOr<ChunkKey> CallerKey(const RemoteNamespace& ns, std::string_view caller_key) {
  if (!ns.caller_keys) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace ", ns.id,
                     " derives its keys from tokens; caller keys need a namespace "
                     "registered with RegisterKeyedNamespace"));
  }
  if (caller_key.empty() || caller_key.size() > kMaxCallerKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a caller key is ", caller_key.size(),
                                                   " bytes; it must be 1 to ", kMaxCallerKeyBytes));
  }
  return CallerChunkKey(ns.root, caller_key);
}

absl::StatusOr<ChainedChunks> ChainChunks(const RemoteNamespace& ns, std::optional<ChunkKey> parent,
                                          std::span<const uint32_t> tokens,
                                          std::span<const uint8_t> payloads) {
  KVC_ASSIGN_OR_RETURN(size_t chunks, WholeChunks(ns, tokens.size(), payloads.size()));
  ChainedChunks out;
  out.chunks.resize(chunks);
  std::optional<ChunkKey> prev = parent;
  for (size_t c = 0; c < chunks; ++c) {
    out.chunks[c].parent = prev;
    out.chunks[c].tokens = tokens.subspan(c * ns.chunk_tokens, ns.chunk_tokens);
    out.chunks[c].payload = payloads.subspan(c * ns.chunk_bytes, ns.chunk_bytes);
    out.keys.push_back(NextChunkKey(prev ? *prev : ns.root, out.chunks[c].tokens));
    prev = out.keys.back();
  }
  return out;
}

absl::Status CheckChunk(const RemoteNamespace& ns, const ChunkToStore& chunk, size_t index) {
  if (ns.caller_keys && (!chunk.key || !chunk.tokens.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, chunk.key ? " gives " : " gives no key and ", chunk.tokens.size(),
        " tokens; namespace ", ns.id, " is caller-keyed (each chunk: its key, no tokens)"));
  }
  if (!ns.caller_keys && chunk.key) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " gives a key (",
                                                   chunk.key->Hex(), "); namespace ", ns.id,
                                                   " derives its keys from tokens"));
  }
  if (ns.caller_keys && chunk.payload.size() != ns.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " has ", chunk.payload.size(),
                                                   " payload bytes; the namespace's pages are ",
                                                   ns.chunk_bytes));
  }
  if (!ns.caller_keys &&
      (chunk.tokens.size() != ns.chunk_tokens || chunk.payload.size() != ns.chunk_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, " has ", chunk.tokens.size(), " tokens and ",
                     chunk.payload.size(), " payload bytes; the namespace's chunks are ",
                     ns.chunk_tokens, " tokens and ", ns.chunk_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> WholeChunks(const RemoteNamespace& ns, size_t tokens, size_t payload_bytes) {
  if (ns.caller_keys || ns.chunk_tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace ", ns.id, " is caller-keyed: store each chunk under its key (StoreChunks)"));
  }
  const size_t chunks = tokens / ns.chunk_tokens;  // a partial last chunk is not stored
  if (payload_bytes != chunks * ns.chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(payload_bytes, " payload bytes for ", tokens, " tokens: their ", chunks,
                     " whole chunks of ", ns.chunk_tokens, " tokens take ", chunks * ns.chunk_bytes,
                     " bytes (", ns.chunk_bytes, " each)"));
  }
  return chunks;
}

std::vector<ChunkKey> CacheApi::Keys(const RemoteNamespace& ns,
                                     std::span<const uint32_t> tokens) const {
  return ChunkKeys(ns.root, tokens, ns.chunk_tokens);
}

absl::StatusOr<LookupResult> CacheClient::Lookup(const RemoteNamespace& ns,
                                                 std::span<const uint32_t> tokens) {
  return LookupImpl(ns, tokens, /*every_chunk=*/false);
}

absl::StatusOr<LookupResult> CacheClient::LookupEvery(const RemoteNamespace& ns,
                                                      std::span<const uint32_t> tokens) {
  return LookupImpl(ns, tokens, /*every_chunk=*/true);
}

absl::StatusOr<LookupResult> CacheClient::LookupKeysEvery(const RemoteNamespace& ns,
                                                          std::span<const ChunkKey> keys) {
  return LookupKeysImpl(ns, keys, /*every_chunk=*/true);
}

absl::StatusOr<LookupResult> CacheClient::LookupKeys(const RemoteNamespace& ns,
                                                     std::span<const ChunkKey> keys) {
  return LookupKeysImpl(ns, keys, /*every_chunk=*/false);
}

absl::StatusOr<LookupResult> CacheClient::LookupKeysImpl(const RemoteNamespace& ns,
                                                         std::span<const ChunkKey> keys,
                                                         bool every_chunk) {
  pb::LookupRequest req;
  req.set_namespace_id(ns.id);
  req.set_every_chunk(every_chunk);
  LookupResult r;
  r.keys.assign(keys.begin(), keys.end());
  if (keys.empty()) return r;
  pb::LookupResponse resp;
  KVC_RETURN_IF_ERROR(LookupByKeys(req, keys, &resp));
  r.matched_chunks = resp.matched_chunks();
  for (int t : resp.tiers()) r.tiers.push_back(TierFromWire(t));
  for (uint32_t i : resp.deleted_chunks()) {
    if (i >= r.keys.size()) {
      return absl::InternalError(
          absl::StrCat("Lookup answered deleted chunk ", i, " of ", r.keys.size()));
    }
    r.deleted.push_back(i);
  }
  const size_t want = every_chunk ? r.keys.size() : r.matched_chunks;
  if (r.tiers.size() != want || r.matched_chunks > r.keys.size()) {
    return absl::InternalError(absl::StrCat("Lookup answered ", r.matched_chunks, " matched and ",
                                            r.tiers.size(), " tiers for ", r.keys.size(),
                                            " chunks"));
  }
  return r;
}

absl::Status CacheClient::LookupByKeys(pb::LookupRequest& req, std::span<const ChunkKey> keys,
                                       pb::LookupResponse* resp) {
  *req.mutable_packed_chunk_keys() = wire::PackKeys(keys);
  KVC_RETURN_IF_ERROR(wire::FromGrpc(rpc_->stub->Lookup(Context().get(), req, resp)));
  if (resp->keys_seen() == keys.size()) return absl::OkStatus();
  // A daemon older than packed keys saw none: the same question, one string per key.
  req.clear_packed_chunk_keys();
  for (const ChunkKey& k : keys) req.add_chunk_keys(KeyBytes(k));
  resp->Clear();
  return wire::FromGrpc(rpc_->stub->Lookup(Context().get(), req, resp));
}

absl::StatusOr<LookupResult> CacheClient::LookupImpl(const RemoteNamespace& ns,
                                                     std::span<const uint32_t> tokens,
                                                     bool every_chunk) {
  pb::LookupRequest req;
  req.set_namespace_id(ns.id);
  req.set_every_chunk(every_chunk);
  LookupResult r;
  // Hash here and send the keys (16 bytes a chunk, not ~5 a token: a 1M-token prefix is a
  // 62 KB request instead of ~4 MB, and the daemon hashes nothing). Needs the vocabulary
  // size to refuse bad tokens as the daemon would; without it, or without a whole chunk,
  // the tokens go instead.
  const bool by_key = ns.vocab_size > 0 && tokens.size() >= ns.chunk_tokens;
  if (by_key) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] >= ns.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokens[", i, "] is ", tokens[i], ", outside the vocabulary of ", ns.vocab_size));
      }
    }
    r.keys = Keys(ns, tokens);
  } else {
    req.mutable_tokens()->Add(tokens.begin(), tokens.end());
  }
  pb::LookupResponse resp;
  KVC_RETURN_IF_ERROR(by_key ? LookupByKeys(req, r.keys, &resp)
                             : wire::FromGrpc(rpc_->stub->Lookup(Context().get(), req, &resp)));
  r.matched_chunks = resp.matched_chunks();
  if (!by_key) {
    for (const std::string& k : resp.chunk_keys()) {
      KVC_ASSIGN_OR_RETURN(ChunkKey key, KeyFrom(k));
      r.keys.push_back(key);
    }
  }
  for (int t : resp.tiers()) r.tiers.push_back(TierFromWire(t));
  if (r.tiers.size() != (every_chunk ? r.keys.size() : r.matched_chunks)) {
    return absl::InternalError(absl::StrCat("Lookup answered ", r.tiers.size(), " tiers for ",
                                            r.keys.size(), " chunks (", r.matched_chunks,
                                            " matched): the daemon predates every_chunk?"));
  }
  return r;
}

absl::StatusOr<size_t> CacheClient::Fetch(const RemoteNamespace& ns, std::span<const ChunkKey> keys,
                                          std::span<uint8_t> out, std::string* short_reason) {
  if (out.size() != keys.size() * ns.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("output buffer is ", out.size(), " bytes; ",
                                                   keys.size(), " chunks need ",
                                                   keys.size() * ns.chunk_bytes));
  }
  std::vector<uint8_t*> dst(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) dst[i] = out.data() + i * ns.chunk_bytes;
  return FetchImpl(ns, keys, dst, short_reason, /*may_remap=*/true);
}

absl::StatusOr<size_t> CacheClient::FetchScattered(const RemoteNamespace& ns,
                                                   std::span<const ChunkKey> keys,
                                                   std::span<uint8_t* const> dst,
                                                   std::string* short_reason) {
  if (dst.size() != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dst.size(), " destinations for ", keys.size(), " chunks"));
  }
  return FetchImpl(ns, keys, dst, short_reason, /*may_remap=*/true);
}

absl::StatusOr<size_t> CacheClient::FetchImpl(const RemoteNamespace& ns,
                                              std::span<const ChunkKey> keys,
                                              std::span<uint8_t* const> dst,
                                              std::string* short_reason, bool may_remap) {
  size_t got = 0;
  if (shared_memory()) {
    if (options_.shm_lease_cache && CopyFromHeldLeases(ns, keys, dst)) return keys.size();
    // Lease the leading chunks that are in RAM and copy them out of the mapped arena; the
    // rest (if any) comes over gRPC below.
    pb::FetchRefsRequest refs_req;
    refs_req.set_namespace_id(ns.id);
    refs_req.set_lease_ms(options_.lease_ms);
    AddKeys(&refs_req, keys);
    for (uint64_t id : TakeLeasesToRelease()) refs_req.add_release_lease_ids(id);
    // Read before asking: a verdict that lands while the call is under way counts as news.
    // The count sits at the start of the arena's last page (wire/arena_handshake.h); the
    // answer says whether this daemon keeps one there.
    const uint64_t verdict_at =
        arena_.bytes >= wire::kVerdictPageBytes ? arena_.bytes - wire::kVerdictPageBytes : 0;
    const uint64_t verdicts = ReadVerdicts(verdict_at);
    const auto sent = std::chrono::steady_clock::now();
    pb::FetchRefsResponse refs;
    KVC_RETURN_IF_ERROR(wire::FromGrpc(rpc_->stub->FetchRefs(Context().get(), refs_req, &refs)));
    if (refs.arena_id() != arena_.id) {
      // kvcached restarted: its offsets are into a new arena, not the one mapped here.
      // Map the new one (the old mapping stays until this client ends: a copy from a held
      // lease may still read it) and ask again; if that fails, use gRPC only.
      RemapArena(refs.lease_id(), may_remap);
      return FetchImpl(ns, keys, dst, short_reason, /*may_remap=*/false);
    }
    std::vector<uint64_t> offsets, checksums;
    for (const pb::ChunkRef& ref : refs.refs()) {
      if (got >= keys.size() || ref.length() != ns.chunk_bytes ||
          ref.arena_offset() + ref.length() > arena_.bytes ||
          ref.chunk_key() != KeyBytes(keys[got])) {
        return absl::DataLossError(absl::StrCat("server gave a bad reference for chunk ", got));
      }
      std::memcpy(dst[got], arena_.base + ref.arena_offset(), ns.chunk_bytes);
      offsets.push_back(ref.arena_offset());
      checksums.push_back(ref.checksum());
      ++got;
    }
    if (refs.lease_id() != 0) {
      // The server's lease started after `sent`; stop using it a margin before it ends.
      const auto margin = std::chrono::milliseconds(refs.lease_ms() / 4);
      const auto until = sent + std::chrono::milliseconds(refs.lease_ms()) - margin;
      if (options_.shm_lease_cache) {
        HoldLease(refs.lease_id(), until, keys.first(got), offsets, checksums, verdicts,
                  refs.verdict_offset() == verdict_at ? verdict_at : 0);
      } else {
        MutexLock lk(lease_mu_);
        to_release_.push_back(refs.lease_id());  // goes with the next call
      }
    }
    if (got == keys.size()) return got;
  }
  pb::FetchRequest req;
  req.set_namespace_id(ns.id);
  AddKeys(&req, keys.subspan(got));
  // Each answer is read as gRPC received it: the key parsed, the payload copied once, from
  // gRPC's buffers into the caller's (a typed read would copy it into a message first).
  static const grpc::internal::RpcMethod kFetchMethod("/kvcache.v1.KVCache/Fetch",
                                                      grpc::internal::RpcMethod::SERVER_STREAMING);
  auto ctx = Context();
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), kFetchMethod,
                                                                    ctx.get(), req));
  grpc::ByteBuffer message;
  std::vector<grpc::Slice> slices;
  std::vector<std::span<const uint8_t>> pieces;
  wire::StoreFrame frame;
  while (reader->Read(&message)) {
    slices.clear();
    pieces.clear();
    absl::Status answer = absl::DataLossError("its bytes cannot be read");
    if (message.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) pieces.emplace_back(s.begin(), s.size());
      answer = wire::CheckFetchAnswer(pieces, got < keys.size() ? keys[got].bytes.data() : nullptr,
                                      ns.chunk_bytes, &frame);
    }
    if (!answer.ok()) {
      ctx->TryCancel();
      reader->Finish();
      return absl::DataLossError(
          absl::StrCat("server answered chunk ", got, ": ", answer.message()));
    }
    uint8_t* to = dst[got];
    for (std::span<const uint8_t> p : frame.payload) {
      std::memcpy(to, p.data(), p.size());
      to += p.size();
    }
    ++got;
  }
  absl::Status s = wire::FromGrpc(reader->Finish());
  if (!s.ok() && !absl::IsNotFound(s)) return s;
  if (!s.ok() && short_reason != nullptr) *short_reason = std::string(s.message());
  return got;  // NotFound mid-way: the leading chunks are usable
}

absl::StatusOr<StoreResult> CacheClient::Store(const RemoteNamespace& ns,
                                               std::optional<ChunkKey> parent,
                                               std::span<const uint32_t> tokens,
                                               std::span<const uint8_t> payloads,
                                               Durability durability, uint32_t ttl_seconds) {
  KVC_ASSIGN_OR_RETURN(ChainedChunks chained, ChainChunks(ns, parent, tokens, payloads));
  KVC_ASSIGN_OR_RETURN(StoreResult r, StoreChunks(ns, chained.chunks, durability, ttl_seconds));
  r.tokens = chained.chunks.size() * ns.chunk_tokens;
  return r;
}

absl::StatusOr<StoreResult> CacheClient::StoreChunks(const RemoteNamespace& ns,
                                                     std::span<const ChunkToStore> chunks,
                                                     Durability durability, uint32_t ttl_seconds) {
  for (size_t i = 0; i < chunks.size(); ++i) KVC_RETURN_IF_ERROR(CheckChunk(ns, chunks[i], i));
  // Each message goes out as two slices: the StoreRequest's other fields serialized with the
  // payload field's header, then the caller's payload bytes themselves (a static slice: no
  // copy into a message, none into gRPC's buffers). They stay valid until this returns,
  // after Finish, when gRPC holds no reference to any message of the call.
  static const grpc::internal::RpcMethod kStoreMethod("/kvcache.v1.KVCache/Store",
                                                      grpc::internal::RpcMethod::CLIENT_STREAMING);
  grpc::ByteBuffer raw_response;
  auto ctx = Context();
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel_.get(), kStoreMethod,
                                                                    ctx.get(), &raw_response));
  pb::StoreRequest req;
  for (const ChunkToStore& c : chunks) {
    req.Clear();
    req.set_namespace_id(ns.id);
    if (c.parent) req.set_parent_key(KeyBytes(*c.parent));
    if (c.key) req.set_chunk_key(KeyBytes(*c.key));
    req.mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
    req.set_durability(static_cast<pb::Durability>(durability));
    req.set_ttl_seconds(ttl_seconds);
    if (c.repair_copy) req.set_repair_copy(true);
    const std::string head = req.SerializeAsString() + wire::StorePayloadHeader(c.payload.size());
    grpc::Slice slices[] = {grpc::Slice(head), grpc::Slice(c.payload.data(), c.payload.size(),
                                                           grpc::Slice::STATIC_SLICE)};
    grpc::ByteBuffer message(slices, 2);
    if (!writer->Write(message)) break;  // the server ended the call: Finish says why
  }
  writer->WritesDone();
  KVC_RETURN_IF_ERROR(wire::FromGrpc(writer->Finish()));
  pb::StoreResponse resp;
  if (!grpc::GenericDeserialize<grpc::ProtoBufferReader, pb::StoreResponse>(&raw_response, &resp)
           .ok()) {
    return absl::DataLossError("the Store answer does not parse as a StoreResponse");
  }
  StoreResult r{resp.stored(), resp.already_present(), {}};
  for (const std::string& k : resp.chunk_keys()) {
    KVC_ASSIGN_OR_RETURN(ChunkKey key, KeyFrom(k));
    r.keys.push_back(key);
  }
  return r;
}

absl::StatusOr<uint32_t> CacheClient::Pin(const RemoteNamespace& ns, std::span<const ChunkKey> keys,
                                          uint32_t ttl_seconds) {
  pb::PinRequest req;
  req.set_namespace_id(ns.id);
  AddKeys(&req, keys);
  req.set_ttl_seconds(ttl_seconds);
  pb::PinResponse resp;
  KVC_RETURN_IF_ERROR(wire::FromGrpc(rpc_->stub->Pin(Context().get(), req, &resp)));
  return resp.pinned();
}

absl::StatusOr<uint32_t> CacheClient::Unpin(const RemoteNamespace& ns,
                                            std::span<const ChunkKey> keys) {
  pb::UnpinRequest req;
  req.set_namespace_id(ns.id);
  AddKeys(&req, keys);
  pb::UnpinResponse resp;
  KVC_RETURN_IF_ERROR(wire::FromGrpc(rpc_->stub->Unpin(Context().get(), req, &resp)));
  return resp.unpinned();
}

absl::StatusOr<uint32_t> CacheClient::Delete(const RemoteNamespace& ns,
                                             std::span<const ChunkKey> keys) {
  {
    // This client no longer serves these from its held leases (other clients' deletes
    // reach it when those leases end).
    MutexLock lk(lease_mu_);
    for (const ChunkKey& k : keys) {
      auto it = held_refs_.find(k);
      if (it == held_refs_.end()) continue;
      auto lease = held_leases_.find(it->second.lease_id);
      if (lease != held_leases_.end() && lease->second.refs > 0) --lease->second.refs;
      held_refs_.erase(it);
    }
  }
  pb::DeleteRequest req;
  req.set_namespace_id(ns.id);
  AddKeys(&req, keys);
  pb::DeleteResponse resp;
  KVC_RETURN_IF_ERROR(wire::FromGrpc(rpc_->stub->Delete(Context().get(), req, &resp)));
  return resp.deleted();
}

absl::StatusOr<pb::StatsResponse> CacheClient::Stats() {
  pb::StatsResponse resp;
  KVC_RETURN_IF_ERROR(
      wire::FromGrpc(rpc_->stub->Stats(Context().get(), pb::StatsRequest(), &resp)));
  return resp;
}

absl::StatusOr<DeviceRefs> CacheClient::FetchDeviceRefs(const RemoteNamespace& ns,
                                                        std::span<const ChunkKey> keys) {
  pb::FetchRefsRequest req;
  req.set_namespace_id(ns.id);
  req.set_lease_ms(options_.lease_ms);
  AddKeys(&req, keys);
  pb::FetchDeviceRefsResponse resp;
  const auto sent = std::chrono::steady_clock::now();
  KVC_RETURN_IF_ERROR(wire::FromGrpc(rpc_->stub->FetchDeviceRefs(Context().get(), req, &resp)));
  DeviceRefs out;
  out.lease_id = resp.lease_id();
  out.ipc_handle = resp.ipc_handle();
  out.device = resp.device();
  out.arena_id = resp.arena_id();
  out.usable_until = sent + std::chrono::milliseconds(resp.lease_ms() * 3 / 4);
  for (int i = 0; i < resp.refs_size(); ++i) {
    const pb::ChunkRef& r = resp.refs(i);
    if (r.chunk_key().size() != 16 || i >= static_cast<int>(keys.size()) ||
        std::memcmp(r.chunk_key().data(), keys[i].bytes.data(), 16) != 0 ||
        r.length() != ns.chunk_bytes) {
      return absl::InternalError(
          absl::StrCat("FetchDeviceRefs answer ", i, " does not match the request"));
    }
    out.chunks.push_back({keys[i], r.arena_offset(), r.length(), r.checksum()});
  }
  return out;
}

bool DeviceRefs::Chunk::Verifies(std::span<const uint8_t> bytes) const {
  // The store's payload checksum (storage/slot_format.h: PayloadChecksum).
  return bytes.size() == length &&
         (checksum == 0 || XXH3_64bits(bytes.data(), bytes.size()) == checksum);
}

absl::Status CacheClient::ReleaseDeviceRefs(uint64_t lease_id) {
  pb::ReleaseRefsRequest req;
  req.set_lease_id(lease_id);
  pb::ReleaseRefsResponse resp;
  return wire::FromGrpc(rpc_->stub->ReleaseRefs(Context().get(), req, &resp));
}

}  // namespace kvc::client
