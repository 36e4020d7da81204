// The shared tier (shared_tier.h) behind ChunkStore's public calls: each runs on this
// node's tiers first (under the store's lock), then asks the shared tier outside it — a
// network away — for what is left: durable puts are sent to it, misses are looked up and
// read in it (and promoted), erases remove its copy.
#include <algorithm>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

namespace {

SharedPut SharedPutOf(const PutRequest& r, SharedTag tag, int64_t expires_s) {
  SharedChunk meta;
  meta.namespace_tag = tag;
  meta.parent = r.parent;
  meta.origin = r.origin;
  meta.expires_s = expires_s;
  return {r.key, meta, r.payload};
}

}  // namespace

std::vector<absl::StatusOr<PutResult>> ChunkStore::PutBatch(std::span<const PutRequest> requests,
                                                            const PutOptions& options) {
  SharedTierLink* link = impl_->shared.get();
  if (link == nullptr || options.durability != Durability::kDurable)
    return PutBatchLocal(requests, options);
  const int64_t expires = options.ttl_s > 0 ? impl_->NowS() + options.ttl_s : 0;
  // Per request: its namespace's tag (0: the namespace stays off the shared tier) and
  // account, and whether this node holds it already (the rest is new to it, and likely to
  // the shared tier) — asked once per run of requests of one namespace (a batch is
  // usually one run).
  std::vector<SharedTag> tags(requests.size());
  std::vector<std::string> accounts(requests.size());
  std::vector<bool> held(requests.size(), false);
  for (size_t run = 0; run < requests.size();) {
    const NamespaceId ns = requests[run].namespace_id;
    const SharedTierLink::Share share = link->ShareOf(ns);
    std::vector<ChunkKey> keys;
    size_t end = run;
    for (; end < requests.size() && requests[end].namespace_id == ns; ++end)
      keys.push_back(requests[end].key);
    const std::vector<Tier> here = LookupLocal(ns, keys, /*leading_only=*/false);
    for (size_t i = run; i < end; ++i) {
      tags[i] = share.tag;
      accounts[i] = share.account;
      held[i] = here[i - run] != Tier::kNone;
    }
    run = end;
  }
  if (std::vector<absl::Status> over = OverSharedQuota(requests, accounts, held); !over.empty()) {
    // Refused before anything is written; the rest are put as one batch.
    std::vector<PutRequest> rest;
    std::vector<size_t> rest_index;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (over[i].ok()) {
        rest.push_back(requests[i]);
        rest_index.push_back(i);
      }
    }
    std::vector<absl::StatusOr<PutResult>> results(over.begin(), over.end());
    std::vector<absl::StatusOr<PutResult>> put = PutBatch(rest, options);
    for (size_t j = 0; j < rest_index.size(); ++j) results[rest_index[j]] = std::move(put[j]);
    return results;
  }
  auto shared_put = [&](size_t i) {
    SharedPut p = SharedPutOf(requests[i], tags[i], expires);
    p.meta.account = accounts[i];
    return p;
  };
  // Written through: chunks this node does not hold yet go to the shared tier while the
  // node writes and syncs its own copy (the acknowledgement waits for both, not one after
  // the other). Write-behind only queues a copy: no need.
  std::vector<size_t> early;
  std::vector<SharedPut> early_puts;
  std::future<std::vector<absl::Status>> early_sent;
  if (!link->write_behind()) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (tags[i] == 0 || held[i]) continue;
      early.push_back(i);
      early_puts.push_back(shared_put(i));
    }
    if (!early.empty())
      early_sent = std::async(std::launch::async, [&] { return link->Store(early_puts); });
  }
  std::vector<absl::StatusOr<PutResult>> results = PutBatchLocal(requests, options);
  std::vector<absl::Status> sent_early;
  if (early_sent.valid()) sent_early = early_sent.get();
  // The rest of the durable puts stored here go to the shared tier now; one that was here
  // already may be missing there (stored before the tier was configured, or by a
  // write-behind a crash lost): asked first, sent if absent.
  std::vector<size_t> send, ask;
  std::vector<bool> sent(requests.size(), false);
  for (size_t j = 0; j < early.size(); ++j) sent[early[j]] = true;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (results[i].ok() && !sent[i] && tags[i] != 0)
      (results[i]->already_present ? ask : send).push_back(i);
  }
  if (!ask.empty()) {
    std::vector<ChunkKey> keys;
    for (size_t i : ask) keys.push_back(requests[i].key);
    const std::vector<absl::StatusOr<bool>> there = link->Contains(keys);
    for (size_t j = 0; j < ask.size(); ++j) {
      if (!there[j].ok() || !*there[j]) send.push_back(ask[j]);
    }
  }
  std::vector<SharedPut> puts;
  for (size_t i : send) puts.push_back(shared_put(i));
  std::vector<absl::Status> sent_now =
      puts.empty() ? std::vector<absl::Status>() : link->Store(puts);
  auto refuse = [&](size_t i, const absl::Status& st) {
    if (st.ok() || !results[i].ok()) return;  // (a put that failed here says why already)
    // Stored on this node, not where it must also be: the put is not acknowledged (a
    // retry finds it here and sends it again).
    results[i] = absl::Status(
        st.code(),
        absl::StrCat(impl_->Where(requests[i].key),
                     " is on this node but the shared tier did not take it: ", st.message()));
  };
  for (size_t j = 0; j < early.size(); ++j) refuse(early[j], sent_early[j]);
  for (size_t j = 0; j < send.size(); ++j) refuse(send[j], sent_now[j]);
  return results;
}

std::vector<absl::Status> ChunkStore::OverSharedQuota(std::span<const PutRequest> requests,
                                                      std::span<const std::string> accounts,
                                                      const std::vector<bool>& held) {
  // The batch's new bytes per account whose group limits them.
  struct Need {
    uint64_t limit = 0, bytes = 0;
    std::string owner;
  };
  std::map<std::string, Need> need;
  {
    MutexLock lock(impl_->mu);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (accounts[i].empty() || held[i]) continue;
      const Impl::QuotaState* q = impl_->QuotaOf(requests[i].namespace_id);
      if (q == nullptr || q->quota.rados_bytes == 0) continue;
      Need& n = need[accounts[i]];
      n.limit = q->quota.rados_bytes;
      n.owner = q->quota.owner;
      n.bytes += requests[i].payload.size();
    }
  }
  std::map<std::string, absl::Status> refused;
  for (const auto& [account, n] : need) {
    // A count the shared tier cannot give does not stop the put: the write itself then
    // fails (write-through) or waits in the bounded backlog (write-behind).
    const absl::StatusOr<uint64_t> holds = impl_->shared->AccountBytes(account);
    if (!holds.ok() || *holds + n.bytes <= n.limit) continue;
    refused[account] = absl::ResourceExhaustedError(absl::StrCat(
        n.owner, " is at its rados quota of ", n.limit, " bytes: it holds ", *holds,
        " in the shared tier and this put adds ", n.bytes, " (nothing there is evicted for it)"));
  }
  if (refused.empty()) return {};
  std::vector<absl::Status> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto r = refused.find(accounts[i]);
    if (r != refused.end() && !held[i]) out[i] = r->second;
  }
  return out;
}

void ChunkStore::GetFromShared(NamespaceId ns, std::span<const ChunkKey> keys,
                               std::span<const std::span<uint8_t>> outs,
                               std::vector<absl::Status>* status, std::vector<Tier>* served_from) {
  const SharedTag tag = impl_->shared->TagOf(ns);
  if (tag == 0) return;
  std::vector<size_t> missed;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::IsNotFound((*status)[i])) missed.push_back(i);
  }
  if (missed.empty()) return;
  std::vector<ChunkKey> ask;
  std::vector<std::span<uint8_t>> into;
  for (size_t i : missed) {
    ask.push_back(keys[i]);
    into.push_back(outs[i]);
  }
  std::vector<SharedChunk> metas;
  const std::vector<absl::Status> got = impl_->shared->Fetch(tag, ask, into, &metas);
  const int64_t now = impl_->NowS();
  struct Promotion {
    ChunkKey key;
    std::optional<ChunkKey> parent;
    std::optional<ChunkOrigin> origin;
    std::span<const uint8_t> bytes;
    uint64_t checksum;
    int64_t expires_s;
  };
  std::vector<Promotion> promote;
  std::vector<ChunkKey> expired;
  for (size_t j = 0; j < missed.size(); ++j) {
    const size_t i = missed[j];
    if (!got[j].ok()) {
      // A miss here and there, or a shared tier that failed to answer: a miss for the
      // caller, saying why (never bytes that did not verify).
      if (!absl::IsNotFound(got[j]))
        (*status)[i] = absl::NotFoundError(
            absl::StrCat((*status)[i].message(), "; the shared tier: ", got[j].message()));
      continue;
    }
    const SharedChunk& m = metas[j];
    if (m.expires_s != 0 && m.expires_s <= now) {
      expired.push_back(keys[i]);
      continue;  // stays a miss
    }
    (*status)[i] = absl::OkStatus();
    if (served_from != nullptr) (*served_from)[i] = Tier::kRados;
    promote.push_back({keys[i], m.parent, m.origin, outs[i], m.payload_checksum, m.expires_s});
  }
  if (!expired.empty()) (void)impl_->shared->Remove(expired);  // past their TTL: gone
  if (promote.empty()) return;
  // Promoted into RAM as clean copies: the shared tier holds the durable one, so nothing
  // is written to SSD for them (a RAM eviction drops one; the next miss reads it from the
  // shared tier again) and the checksum the read verified is kept, not computed again. A
  // namespace without RAM gets no copy here, and a promotion that finds no room without
  // waiting is skipped: the read has its bytes.
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  if (!s.HasRam(ns)) return;
  for (const Promotion& p : promote) {
    if (s.ram->Contains(p.key)) continue;
    if (s.InsertRam(ns, p.key, p.parent, p.origin, Payload(p.bytes), p.checksum,
                    /*dirty=*/false, p.expires_s, /*allow_writeback=*/false)
            .ok())
      ++s.stats.promotions;
  }
}

std::vector<Tier> ChunkStore::Lookup(NamespaceId ns, std::span<const ChunkKey> keys,
                                     bool leading_only) const {
  std::vector<Tier> tiers = LookupLocal(ns, keys, leading_only);
  SharedTierLink* link = impl_->shared.get();
  if (link == nullptr || link->TagOf(ns) == 0) return tiers;
  // Every key this node does not hold is asked at once (one round trip); with
  // leading_only the answer stops at the first the shared tier does not hold either.
  std::vector<size_t> missed;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (tiers[i] == Tier::kNone) missed.push_back(i);
  }
  if (missed.empty()) return tiers;
  std::vector<ChunkKey> ask;
  for (size_t i : missed) ask.push_back(keys[i]);
  const std::vector<absl::StatusOr<bool>> there = link->Contains(ask);
  for (size_t j = 0; j < missed.size(); ++j) {
    const bool held = there[j].ok() && *there[j];
    if (held) tiers[missed[j]] = Tier::kRados;
    if (!held && leading_only) {
      for (size_t k = missed[j]; k < keys.size(); ++k) tiers[k] = Tier::kNone;
      break;
    }
  }
  return tiers;
}

std::vector<absl::Status> ChunkStore::EraseBatch(NamespaceId ns, std::span<const ChunkKey> keys) {
  std::vector<absl::Status> status = EraseBatchLocal(ns, keys);
  SharedTierLink* link = impl_->shared.get();
  if (link == nullptr || link->TagOf(ns) == 0) return status;
  // The shared copy goes too, whether this node held the chunk or not: a copy left there
  // would bring an erased chunk back on the next miss.
  const std::vector<absl::Status> removed = link->Remove(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (removed[i].ok()) {
      status[i] = absl::OkStatus();  // it was there (here too, or only there)
    } else if (!absl::IsNotFound(removed[i])) {
      status[i] = absl::Status(removed[i].code(),
                               absl::StrCat(impl_->Where(keys[i]),
                                            ": the shared tier still holds it (the remove failed: ",
                                            removed[i].message(), ")"));
    }
  }
  return status;
}

void ChunkStore::SetSharedTag(NamespaceId ns, SharedTag tag, std::string account) {
  if (impl_->shared) impl_->shared->SetTag(ns, tag, std::move(account));
}

absl::StatusOr<uint64_t> ChunkStore::SharedAccountBytes(const std::string& account) {
  if (!impl_->shared) return absl::FailedPreconditionError("the store has no shared tier");
  return impl_->shared->AccountBytes(account);
}

absl::StatusOr<SharedSweep> ChunkStore::SweepSharedTier() {
  if (!impl_->shared) return absl::FailedPreconditionError("the store has no shared tier");
  return impl_->shared->Sweep(impl_->NowS());
}

absl::Status ChunkStore::DrainSharedTier(std::chrono::milliseconds timeout) {
  if (!impl_->shared) return absl::OkStatus();
  return impl_->shared->Drain(timeout);
}

}  // namespace kvc::storage
