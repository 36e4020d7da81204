#include "cachesvc/service.h"

#include "base/status_macros.h"
#include "cachesvc/service_impl.h"

namespace kvc::cachesvc {

// ---- the service ----

KvCacheService::KvCacheService(storage::ChunkStore* store, NamespaceRegistry* registry,
                               const Authenticator* auth, ServiceOptions options)
    : impl_(std::make_unique<Impl>(store, registry, auth, options)) {
  // Leases of clients that vanished end on time even when no other call comes.
  reaper_ = std::thread([this] {
    MutexLock lk(reaper_mu_);
    while (!WaitForFlag(reaper_cv_, reaper_mu_, stopping_, std::chrono::milliseconds(200))) {
      impl_->ReapLeases();
    }
  });
}

KvCacheService::~KvCacheService() {
  {
    MutexLock lk(reaper_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  reaper_.join();
}

grpc::ServerUnaryReactor* KvCacheService::FetchRefs(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* raw_req,
                                                    grpc::ByteBuffer* raw_resp) {
  // In-memory bookkeeping only: answered on the gRPC thread, saving a hop per fetch.
  return impl_->RawUnary<pb::FetchRefsRequest, pb::FetchRefsResponse>(
      "FetchRefs", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::FetchRefsRequest* req, pb::FetchRefsResponse* resp) {
        return impl_->DoFetchRefs(t, *req, resp);
      },
      /*inline_work=*/true);
}

grpc::ServerUnaryReactor* KvCacheService::FetchDeviceRefs(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* raw_req,
                                                          grpc::ByteBuffer* raw_resp) {
  // On the executor: a promotion reads from SSD and copies into device memory.
  return impl_->RawUnary<pb::FetchRefsRequest, pb::FetchDeviceRefsResponse>(
      "FetchDeviceRefs", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::FetchRefsRequest* req,
             pb::FetchDeviceRefsResponse* resp) {
        return impl_->DoFetchDeviceRefs(t, *req, resp);
      });
}

grpc::ServerUnaryReactor* KvCacheService::ReleaseRefs(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw_req,
                                                      grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::ReleaseRefsRequest, pb::ReleaseRefsResponse>(
      "ReleaseRefs", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::ReleaseRefsRequest* req, pb::ReleaseRefsResponse*) {
        return impl_->DoReleaseRefs(t, req->lease_id());
      },
      /*inline_work=*/true);
}

grpc::ServerUnaryReactor* KvCacheService::RegisterNamespace(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* raw_req,
                                                            grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::RegisterNamespaceRequest, pb::RegisterNamespaceResponse>(
      "RegisterNamespace", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::RegisterNamespaceRequest* req,
             pb::RegisterNamespaceResponse* resp) { return impl_->Register(t, *req, resp); });
}

namespace {
// What a Lookup is charged (cost_pacer.h): its request's bytes in 16-byte units, one per
// caller key or four tokens, known before it is parsed.
uint64_t LookupCostKeys(const grpc::ByteBuffer& raw) { return raw.Length() / 16 + 1; }
}  // namespace

grpc::ServerUnaryReactor* KvCacheService::Lookup(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* raw_req,
                                                 grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::LookupRequest, pb::LookupResponse>(
      "Lookup", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::LookupRequest* req, pb::LookupResponse* resp) {
        return impl_->DoLookup(t, *req, resp);
      },
      /*inline_work=*/false, LookupCostKeys(*raw_req));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvCacheService::Fetch(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* raw) {
  absl::Status status;
  std::string tenant(1, '-');
  pb::FetchRequest req;
  grpc::ByteBuffer copy(*raw);  // shares the slices
  if (grpc::Status parsed = grpc::SerializationTraits<pb::FetchRequest>::Deserialize(&copy, &req);
      !parsed.ok()) {
    status = absl::InvalidArgumentError("FetchRequest does not parse");
  } else if (absl::StatusOr<TenantLimiter::Slot> slot = impl_->Admit(ctx, &tenant); !slot.ok()) {
    status = slot.status();
  } else if (auto nk = impl_->NamespaceAndKeys(tenant, req); !nk.ok()) {
    status = nk.status();
  } else {
    return StartFetch(impl_.get(), *std::move(slot), *std::move(nk));
  }
  // Fails before streaming anything.
  class Failed final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    explicit Failed(const grpc::Status& s) { Finish(s); }
    void OnDone() override { delete this; }
  };
  impl_->Observe("Fetch", tenant, wire::ToGrpc(status), std::chrono::steady_clock::now());
  return new Failed(wire::ToGrpc(status));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* KvCacheService::Store(grpc::CallbackServerContext* ctx,
                                                                 grpc::ByteBuffer* resp) {
  std::string tenant(1, '-');
  absl::StatusOr<TenantLimiter::Slot> slot = impl_->Admit(ctx, &tenant);
  if (!slot.ok()) {
    class Failed final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
     public:
      explicit Failed(const grpc::Status& s) { Finish(s); }
      void OnDone() override { delete this; }
    };
    impl_->Observe("Store", tenant, wire::ToGrpc(slot.status()), std::chrono::steady_clock::now());
    return new Failed(wire::ToGrpc(slot.status()));
  }
  return StartStore(impl_.get(), *std::move(slot), resp);
}

grpc::ServerUnaryReactor* KvCacheService::Pin(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* raw_req,
                                              grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::PinRequest, pb::PinResponse>(
      "Pin", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::PinRequest* req,
             pb::PinResponse* resp) -> absl::Status {
        if (req->ttl_seconds() == 0)
          return absl::InvalidArgumentError("ttl_seconds must be positive (use Unpin to unpin)");
        KVC_ASSIGN_OR_RETURN(uint32_t n, impl_->DoPin(t, *req, NowS() + req->ttl_seconds()));
        resp->set_pinned(n);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::Unpin(grpc::CallbackServerContext* ctx,
                                                const grpc::ByteBuffer* raw_req,
                                                grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::UnpinRequest, pb::UnpinResponse>(
      "Unpin", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::UnpinRequest* req,
             pb::UnpinResponse* resp) -> absl::Status {
        auto nk = impl_->NamespaceAndKeys(t, *req);
        if (!nk.ok()) return nk.status();
        KVC_ASSIGN_OR_RETURN(uint32_t n,
                             Impl::CountOk(impl_->store->PinBatch(nk->ns.store_id, nk->stored, 0)));
        resp->set_unpinned(n);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::Delete(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* raw_req,
                                                 grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::DeleteRequest, pb::DeleteResponse>(
      "Delete", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::DeleteRequest* req,
             pb::DeleteResponse* resp) -> absl::Status {
        auto nk = impl_->NamespaceAndKeys(t, *req);
        if (!nk.ok()) return nk.status();
        const std::vector<absl::Status> erased =
            impl_->store->EraseBatch(nk->ns.store_id, nk->stored);
        if (Tombstones* tombs = impl_->opt.tombstones; tombs != nullptr) {
          // Remembered where a copy was erased: a node that missed this Delete must not
          // bring its copy back (docs/cluster.md, "Deletes").
          std::vector<ChunkKey> gone;
          for (size_t i = 0; i < erased.size(); ++i) {
            if (erased[i].ok()) gone.push_back(nk->stored[i]);
          }
          KVC_RETURN_IF_ERROR(tombs->Add(nk->ns.store_id, gone));
        }
        KVC_ASSIGN_OR_RETURN(uint32_t n, Impl::CountOk(erased));
        resp->set_deleted(n);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::ListPins(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* raw_req,
                                                   grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::ListPinsRequest, pb::ListPinsResponse>(
      "ListPins", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::ListPinsRequest* req, pb::ListPinsResponse* resp) {
        return impl_->DoTenantPins(t, req->tenant(), req->limit() ? req->limit() : 1000,
                                   /*unpin=*/false, resp, nullptr);
      });
}

grpc::ServerUnaryReactor* KvCacheService::UnpinTenant(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw_req,
                                                      grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::UnpinTenantRequest, pb::UnpinResponse>(
      "UnpinTenant", ctx, raw_req, raw_resp,
      [this](const std::string& t, const pb::UnpinTenantRequest* req, pb::UnpinResponse* resp) {
        uint32_t n = 0;
        KVC_RETURN_IF_ERROR(impl_->DoTenantPins(t, req->tenant(), 0, /*unpin=*/true, nullptr, &n));
        resp->set_unpinned(n);
        return absl::OkStatus();
      });
}

void KvCacheService::StopTakingStores() { impl_->refusing_stores = true; }

grpc::ServerUnaryReactor* KvCacheService::Stats(grpc::CallbackServerContext* ctx,
                                                const grpc::ByteBuffer* raw_req,
                                                grpc::ByteBuffer* raw_resp) {
  return impl_->RawUnary<pb::StatsRequest, pb::StatsResponse>(
      "Stats", ctx, raw_req, raw_resp,
      [this](const std::string& tenant, const pb::StatsRequest*, pb::StatsResponse* resp) {
        const storage::StoreStats s = impl_->store->Stats();
        // The tiers' sizes and the I/O backend say nothing about any tenant.
        resp->set_ram_capacity_chunks(s.ram_capacity_chunks);
        resp->set_ssd_capacity_chunks(s.ssd_capacity_chunks);
        resp->set_ssd_capacity_bytes(s.ssd_capacity_bytes);
        resp->set_io_backend(s.io_backend);
        resp->set_hbm_capacity_chunks(s.hbm_capacity_chunks);
        if (pb::TenantQuota q; impl_->QuotaOf(tenant, &q)) *resp->mutable_quota() = q;
        if (!impl_->SeesTotals(tenant)) {
          // Only the caller's own chunks and fetches: another tenant's activity is not its
          // business (nor a side channel).
          std::set<storage::NamespaceId> own;
          for (const NamespaceInfo& ns : impl_->registry->All()) {
            if (ns.tenant == tenant) own.insert(ns.store_id);
          }
          const storage::ChunkStore::ChunkCounts n = impl_->store->CountChunks(own);
          const TenantCounters::Counts c = impl_->CountersOf(tenant);
          resp->set_ram_chunks(n.ram);
          resp->set_ssd_chunks(n.ssd);
          resp->set_ssd_bytes(n.ssd_bytes);
          resp->set_hbm_chunks(n.hbm);
          resp->set_ram_hits(c.ram_hits);
          resp->set_ssd_hits(c.ssd_hits);
          resp->set_misses(c.misses);
          return absl::OkStatus();
        }
        resp->set_ram_chunks(s.ram_chunks);
        resp->set_ssd_chunks(s.ssd_chunks);
        resp->set_ssd_bytes(s.ssd_bytes);
        for (const storage::StoreStats::SsdClassStats& c : s.ssd_classes) {
          pb::SsdSizeClass* out = resp->add_ssd_classes();
          out->set_slot_bytes(c.slot_bytes);
          out->set_chunks(c.chunks);
        }
        resp->set_ram_hits(s.ram_hits);
        resp->set_ssd_hits(s.ssd_hits);
        resp->set_misses(s.misses);
        resp->set_checksum_failures(s.checksum_failures);
        resp->set_ram_checksum_failures(s.ram_checksum_failures);
        resp->set_ram_scrub_bytes(s.ram_scrub_bytes);
        resp->set_ram_scrub_passes(s.ram_scrub_passes);
        resp->set_ram_scrub_last_pass_unix_s(s.ram_scrub_last_pass_s);
        resp->set_ram_scrub_progress(s.ram_scrub_progress);
        resp->set_evictions(s.ram_evictions + s.ssd_evictions);
        resp->set_read_errors(s.read_errors);
        resp->set_write_errors(s.write_errors);
        resp->set_recovered_chunks(s.recovered_chunks);
        resp->set_unreadable_slots_at_open(s.unreadable_slots_at_open);
        if (!s.shared.name.empty()) {
          pb::SharedTierStats* t = resp->mutable_shared_tier();
          t->set_name(s.shared.name);
          t->set_write_behind(s.shared.write_behind);
          t->set_puts(s.shared.puts);
          t->set_put_errors(s.shared.put_errors);
          t->set_hits(s.shared.hits);
          t->set_misses(s.shared.misses);
          t->set_read_errors(s.shared.read_errors);
          t->set_removes(s.shared.removes);
          t->set_backlog_chunks(s.shared.backlog_chunks);
          t->set_backlog_bytes(s.shared.backlog_bytes);
          t->set_reachable(s.shared.reachable);
          t->set_last_error(s.shared.last_error);
          t->set_sweeps(s.shared.sweeps);
          t->set_swept(s.shared.swept);
        }
        resp->set_index_rebuilds(s.index_rebuilds);
        resp->set_index_load_s(s.index_load_s);
        resp->set_hbm_chunks(s.hbm_chunks);
        resp->set_hbm_hits(s.hbm_hits);
        if (impl_->opt.repair_stats) impl_->opt.repair_stats(resp->mutable_repair());
        return absl::OkStatus();
      });
}

}  // namespace kvc::cachesvc
