#include "cachesvc/service_impl.h"

namespace kvc::cachesvc {

absl::StatusOr<std::vector<ChunkKey>> ParseKeys(
    const google::protobuf::RepeatedPtrField<std::string>& raw, uint32_t max_keys) {
  if (raw.size() > static_cast<int>(max_keys)) {
    return absl::InvalidArgumentError(
        absl::StrCat(raw.size(), " chunk keys in one call; the limit is ", max_keys));
  }
  std::vector<ChunkKey> keys;
  keys.reserve(raw.size());
  for (int i = 0; i < raw.size(); ++i) {
    KVC_ASSIGN_OR_RETURN(ChunkKey k, wire::KeyFrom(raw[i], absl::StrCat("chunk_keys[", i, "]")));
    keys.push_back(k);
  }
  return keys;
}

KvCacheService::Impl::Impl(storage::ChunkStore* s, NamespaceRegistry* r, const Authenticator* a,
                           ServiceOptions o)
    : store(s),
      registry(r),
      auth(a),
      opt(o),
      limiter(o.max_calls_per_tenant),
      leases(o.max_ref_leases),
      quotas(s, &opt.quotas),
      pacer(CostPacerOptions{.keys_per_second = o.lookup_keys_per_second,
                             .burst_keys = std::max(o.lookup_keys_per_second / 4,
                                                    static_cast<double>(o.max_keys_per_call))}),
      executor(o.executor_threads, o.executor_queue) {
  if (s->hbm_arena() != nullptr) hbm_handle = s->hbm_arena()->ExportHandle();
  for (size_t pool = 0; pool < s->ram_pool_count(); ++pool) {
    const int fd = s->ram_arena_fd(static_cast<storage::RamPoolId>(pool));
    arena_ids.push_back(fd >= 0 ? wire::ArenaIdentity(fd) : 0);
  }
  // Namespaces of tenants with a RAM pool of their own keep their chunks there.
  for (const NamespaceInfo& ns : r->All()) {
    AssignRamPool(ns);
    ShareNamespace(ns);
    quotas.Assign(ns);
  }
}

void KvCacheService::Impl::AssignRamPool(const NamespaceInfo& ns) {
  const std::optional<storage::RamPoolId> pool = opt.shm.PoolOf(ns.tenant);
  if (pool && *pool != 0 && *pool < store->ram_pool_count()) {
    absl::Status s = store->SetRamPool(ns.store_id, *pool);
    KVC_CHECK(s.ok()) << "namespace " << ns.id << ": " << s;
  }
}

void KvCacheService::Impl::ShareNamespace(const NamespaceInfo& ns) {
  store->SetSharedTag(ns.store_id, ns.key_scope >= kKeyScopeBound ? SharedNamespaceTag(ns) : 0,
                      SharedAccountOf(ns.tenant));
}

void KvCacheService::Impl::Observe(const char* method, absl::string_view tenant,
                                   const grpc::Status& s,
                                   std::chrono::steady_clock::time_point start) const {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (opt.metrics != nullptr) opt.metrics->ObserveCall(method, s.error_code(), seconds);
  const LogLevel level = s.ok()                                ? LogLevel::kDebug
                         : wire::IsServerFault(s.error_code()) ? LogLevel::kError
                                                               : LogLevel::kInfo;
  if (!LogEnabled(level)) return;
  LogLine line(level, "call");
  line.Str("method", method)
      .Str("tenant", tenant)
      .Str("code", wire::StatusCodeName(s.error_code()))
      .Num("ms", seconds * 1e3);
  if (!s.ok()) line.Str("error", s.error_message());
}

absl::StatusOr<TenantLimiter::Slot> KvCacheService::Impl::Admit(
    const grpc::CallbackServerContext* ctx, std::string* tenant) {
  KVC_ASSIGN_OR_RETURN(std::string t, auth->TenantFor(Authorization(ctx)));
  *tenant = t;
  return limiter.Acquire(t);
}

std::vector<absl::StatusOr<storage::PutResult>> KvCacheService::Impl::PutDurable(
    std::span<const storage::PutRequest> puts, std::span<const int64_t> ttl_s) {
  std::vector<absl::StatusOr<storage::PutResult>> results;
  results.reserve(puts.size());
  for (size_t at = 0; at < puts.size();) {
    size_t end = at + 1;
    while (end < puts.size() && ttl_s[end] == ttl_s[at]) ++end;
    for (absl::StatusOr<storage::PutResult>& r :
         store->PutBatch(puts.subspan(at, end - at), {storage::Durability::kDurable, ttl_s[at]})) {
      results.push_back(std::move(r));
    }
    at = end;
  }
  return results;
}

absl::StatusOr<NamespaceInfo> KvCacheService::Impl::Namespace(uint32_t id,
                                                              const std::string& tenant) const {
  std::optional<NamespaceInfo> ns = registry->Get(id, tenant);
  if (!ns) return absl::NotFoundError(absl::StrCat("namespace ", id, " not found"));
  return *ns;
}

absl::Status KvCacheService::Impl::CheckName(const char* field, const std::string& value) const {
  if (value.size() > opt.max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", value.size(),
                                                   " bytes; the limit is ", opt.max_name_bytes,
                                                   " (kvcached --max-name-bytes)"));
  }
  return absl::OkStatus();
}

absl::Status KvCacheService::Impl::Register(const std::string& tenant,
                                            const pb::RegisterNamespaceRequest& req,
                                            pb::RegisterNamespaceResponse* resp) {
  if (req.model_id().empty()) return absl::InvalidArgumentError("model_id is empty");
  // Bounded before anything is parsed or kept: the id goes into the registry's log, every
  // peer call about the namespace and the daemon's memory for as long as it exists.
  KVC_RETURN_IF_ERROR(CheckName("model_id", req.model_id()));
  if (req.model_config_json().size() > opt.max_model_config_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_config_json is ", req.model_config_json().size(),
                     " bytes; the limit is ", opt.max_model_config_bytes));
  }
  NamespaceInfo info;
  info.tenant = tenant;
  info.model_id = req.model_id();
  info.key_scope = kKeyScopeLatest;  // a namespace registered before keeps its own
  if (req.key_mode() == pb::KEY_MODE_CALLER) {
    KVC_RETURN_IF_ERROR(CallerKeyedNamespace(req, &info));
  } else if (req.key_mode() == pb::KEY_MODE_TOKENS) {
    KVC_RETURN_IF_ERROR(TokenKeyedNamespace(req, &info));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("key_mode is ", req.key_mode(), "; it must be ",
                                                   pb::KEY_MODE_TOKENS, " (tokens) or ",
                                                   pb::KEY_MODE_CALLER, " (caller)"));
  }
  // The tenant's quota is admitted before its first namespace exists: a quota that does
  // not fit refuses the registration and leaves nothing behind.
  KVC_RETURN_IF_ERROR(quotas.Admit(tenant, /*must_fit=*/true));
  KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, registry->FindOrAdd(info));
  KVC_RETURN_IF_ERROR(store->RegisterNamespace(ns.store_id, ns.chunk_bytes));
  AssignRamPool(ns);
  ShareNamespace(ns);
  quotas.Assign(ns);
  resp->set_namespace_id(ns.id);
  resp->set_chunk_bytes(ns.chunk_bytes);
  resp->set_chunk_tokens(ns.chunk_tokens);
  resp->set_root_key(KeyBytes(ns.root));
  resp->set_kv_layout_version(ns.key_mode == kKeysFromCaller ? 0 : kKvLayoutVersion);
  resp->set_vocab_size(ns.vocab_size);
  resp->set_key_mode(static_cast<pb::KeyMode>(ns.key_mode));
  return absl::OkStatus();
}

absl::Status KvCacheService::Impl::CallerKeyedNamespace(const pb::RegisterNamespaceRequest& req,
                                                        NamespaceInfo* info) const {
  // The caller lays its pages out itself: the server needs their size, not the model.
  if (req.page_bytes() == 0) {
    return absl::InvalidArgumentError(
        "page_bytes is 0; a caller-keyed namespace needs the bytes of one page");
  }
  if (req.page_bytes() > opt.max_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("page_bytes is ", req.page_bytes(),
                                                   "; this server stores chunks of at most ",
                                                   opt.max_chunk_bytes, " bytes"));
  }
  info->chunk_tokens = req.chunk_tokens();
  info->chunk_bytes = req.page_bytes();
  info->vocab_size = 0;
  info->key_mode = kKeysFromCaller;
  info->root = client::CallerNamespaceRoot(info->tenant, info->model_id, info->chunk_bytes,
                                           info->chunk_tokens);
  return absl::OkStatus();
}

absl::Status KvCacheService::Impl::TokenKeyedNamespace(const pb::RegisterNamespaceRequest& req,
                                                       NamespaceInfo* info) const {
  if (req.page_bytes() != 0) {
    return absl::InvalidArgumentError(
        "page_bytes is for caller-keyed namespaces (key_mode CALLER); a token-keyed "
        "namespace's chunk size follows from the model config");
  }
  KVC_ASSIGN_OR_RETURN(ModelConfig config,
                       ParseModelConfig(req.model_config_json(), "model_config_json"));
  KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(config));
  const uint32_t chunk_tokens = req.chunk_tokens() ? req.chunk_tokens() : opt.default_chunk_tokens;
  KVC_ASSIGN_OR_RETURN(ChunkLayout layout, BuildChunkLayout(config, schedule, chunk_tokens));
  if (static_cast<uint64_t>(layout.chunk_bytes) > opt.max_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a chunk of ", chunk_tokens, " tokens is ", layout.chunk_bytes,
                     " bytes; this server stores chunks of at most ", opt.max_chunk_bytes));
  }
  info->chunk_tokens = chunk_tokens;
  info->chunk_bytes = static_cast<uint64_t>(layout.chunk_bytes);
  info->vocab_size = static_cast<uint64_t>(config.vocab_size);
  info->key_mode = kKeysFromTokens;
  info->root = client::NamespaceRoot(info->tenant, client::ModelFingerprint(req.model_id(), layout),
                                     kKvLayoutVersion, chunk_tokens);
  return absl::OkStatus();
}

absl::Status KvCacheService::Impl::CheckTokens(
    const NamespaceInfo& ns, const google::protobuf::RepeatedField<uint32_t>& tokens) const {
  for (int i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= ns.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens[", i, "] is ", tokens[i], ", outside the vocabulary of ", ns.vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> KvCacheService::Impl::CountOk(const std::vector<absl::Status>& statuses) {
  uint32_t ok = 0;
  for (const absl::Status& s : statuses) {
    if (s.ok())
      ++ok;
    else if (!absl::IsNotFound(s))
      return s;
  }
  return ok;
}

absl::StatusOr<uint32_t> KvCacheService::Impl::DoPin(const std::string& tenant,
                                                     const pb::PinRequest& req, int64_t until) {
  KVC_ASSIGN_OR_RETURN(ScopedKeys nk, NamespaceAndKeys(tenant, req));
  return CountOk(store->PinBatch(nk.ns.store_id, nk.stored, until));
}

absl::Status KvCacheService::Impl::DoTenantPins(const std::string& caller,
                                                const std::string& tenant, uint32_t limit,
                                                bool unpin, pb::ListPinsResponse* listed,
                                                uint32_t* unpinned) {
  if (!SeesTotals(caller)) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant ", caller,
                     " may not see or change another tenant's pins (kvcached --admin-tenants)"));
  }
  if (tenant.empty()) return absl::InvalidArgumentError("tenant is empty");
  std::map<storage::NamespaceId, NamespaceInfo> own;  // by store_id
  for (NamespaceInfo& ns : registry->All()) {
    if (ns.tenant == tenant) own.emplace(ns.store_id, std::move(ns));
  }
  std::map<storage::NamespaceId, std::vector<ChunkKey>> to_unpin;
  uint32_t total = 0;
  for (const storage::ChunkStore::ChunkListing& c : store->ListPinned()) {
    auto ns = own.find(c.namespace_id);
    if (ns == own.end()) continue;
    ++total;
    if (unpin) to_unpin[c.namespace_id].push_back(c.key);
    if (listed != nullptr && static_cast<uint32_t>(listed->pins_size()) < limit) {
      pb::PinnedChunk* p = listed->add_pins();
      p->set_namespace_id(ns->second.id);
      p->set_model_id(ns->second.model_id);
      if (c.origin) p->set_chunk_key(KeyBytes(c.origin->key));
      p->set_pin_until_unix_s(c.pin_until_s);
    }
  }
  if (listed != nullptr) listed->set_total(total);
  if (unpinned != nullptr) *unpinned = 0;
  for (const auto& [store_id, keys] : to_unpin) {
    KVC_ASSIGN_OR_RETURN(uint32_t n, CountOk(store->PinBatch(store_id, keys, 0)));
    *unpinned += n;
  }
  return absl::OkStatus();
}

absl::Status KvCacheService::Impl::DoFetchRefs(const std::string& tenant,
                                               const pb::FetchRefsRequest& req,
                                               pb::FetchRefsResponse* resp) {
  KVC_ASSIGN_OR_RETURN(storage::RamPoolId pool, opt.shm.MappablePool(tenant, *store));
  auto nk = NamespaceAndKeys(tenant, req);
  if (!nk.ok()) return nk.status();
  for (uint64_t done : req.release_lease_ids()) (void)DoReleaseRefs(tenant, done);  // saves a call
  ReapLeases();
  const uint32_t ms =
      std::min(req.lease_ms() ? req.lease_ms() : opt.default_lease_ms, opt.max_lease_ms);
  resp->set_lease_ms(ms);
  resp->set_arena_id(arena_ids.at(pool));
  static_assert(storage::RamArena::kVerdictPageBytes == wire::kVerdictPageBytes,
                "the arena's layout is the handshake's");
  resp->set_verdict_offset(store->ram_verdict_offset(pool));
  RefLease lease{tenant, {}, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), {}};
  for (size_t i = 0; i < nk->keys.size(); ++i) {
    absl::StatusOr<storage::RamLease> l = store->LeaseRam(nk->ns.store_id, nk->stored[i]);
    // The leading chunks only; the client fetches the rest over gRPC. A chunk in another
    // pool (stored before the tenant had its own) is not in the caller's mapping.
    if (!l.ok() || l->pool() != pool) break;
    CountFetch(tenant, 1, 0, 0);
    pb::ChunkRef* ref = resp->add_refs();
    ref->set_chunk_key(KeyBytes(nk->keys[i]));
    ref->set_arena_offset(l->arena_offset());
    ref->set_length(l->bytes().size());
    // A client that copies the chunk again later without asking (a held lease) checks
    // each copy against it, so a copy the scrub later finds corrupt is not used again.
    ref->set_checksum(l->checksum());
    lease.ram.push_back(*std::move(l));
  }
  if (lease.ram.empty()) return absl::OkStatus();
  return Hold(std::move(lease), resp);
}

absl::Status KvCacheService::Impl::DoFetchDeviceRefs(const std::string& tenant,
                                                     const pb::FetchRefsRequest& req,
                                                     pb::FetchDeviceRefsResponse* resp) {
  const storage::DeviceArena* arena = store->hbm_arena();
  if (arena == nullptr) {
    return absl::FailedPreconditionError(
        "this kvcached has no HBM tier (start it with --hbm-bytes on a machine with a GPU)");
  }
  if (auth->enabled() && !opt.device_tenants.contains(tenant)) {  // before any work
    return absl::PermissionDeniedError(
        absl::StrCat("tenant ", tenant, " may not map the HBM tier (see --shm-tenants)"));
  }
  auto nk = NamespaceAndKeys(tenant, req);
  if (!nk.ok()) return nk.status();
  for (uint64_t done : req.release_lease_ids()) (void)DoReleaseRefs(tenant, done);
  ReapLeases();
  const uint32_t ms =
      std::min(req.lease_ms() ? req.lease_ms() : opt.default_lease_ms, opt.max_lease_ms);
  resp->set_lease_ms(ms);
  resp->set_ipc_handle(hbm_handle);
  resp->set_device(arena->device());
  resp->set_arena_id(arena->id());
  RefLease lease{tenant, {}, std::chrono::steady_clock::now() + std::chrono::milliseconds(ms), {}};
  for (size_t i = 0; i < nk->keys.size(); ++i) {
    // A T0 hit, or a copy promoted from RAM or SSD. Missing, failed its checksum, or
    // every T0 slot leased: the prefix ends here.
    absl::StatusOr<storage::HbmLease> l = store->LeaseHbm(nk->ns.store_id, nk->stored[i]);
    if (!l.ok()) break;
    pb::ChunkRef* ref = resp->add_refs();
    ref->set_chunk_key(KeyBytes(nk->keys[i]));
    ref->set_arena_offset(l->offset());
    ref->set_length(l->length());
    ref->set_checksum(l->checksum());
    lease.hbm.push_back(*std::move(l));
  }
  if (lease.hbm.empty()) return absl::OkStatus();
  return Hold(std::move(lease), resp);
}

}  // namespace kvc::cachesvc
