#include "cachesvc/repair.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "cluster/placement.h"
#include "kvcache/v1/peer.grpc.pb.h"
#include "wire/grpc_status.h"
#include "wire/wire.h"

namespace kvc::cachesvc {
namespace {

namespace pb = ::kvcache::v1;
using Clock = std::chrono::steady_clock;

constexpr size_t kHoldsKeysPerCall = 16384;
constexpr auto kCallTimeout = std::chrono::seconds(30);

pb::PeerNamespace ToPeer(const NamespaceInfo& ns) {
  pb::PeerNamespace p;
  p.set_namespace_id(ns.id);
  p.set_tenant(ns.tenant);
  p.set_root_key(wire::KeyBytes(ns.root));
  p.set_model_id(ns.model_id);
  p.set_chunk_tokens(ns.chunk_tokens);
  p.set_chunk_bytes(ns.chunk_bytes);
  p.set_vocab_size(ns.vocab_size);
  p.set_key_mode(ns.key_mode == kKeysFromCaller ? pb::KEY_MODE_CALLER : pb::KEY_MODE_TOKENS);
  return p;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// One stub per peer address, made on first use; every call carries the cluster credential.
class ClusterRepair::Peers {
 public:
  Peers(std::string secret, const std::string& tls_roots) : secret_(std::move(secret)) {
    if (tls_roots.empty()) {
      creds_ = grpc::InsecureChannelCredentials();
    } else {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = tls_roots;
      creds_ = grpc::SslCredentials(ssl);
    }
  }
  pb::ClusterPeer::Stub* Stub(const std::string& address) {
    MutexLock lk(mu_);
    auto& stub = stubs_[address];
    if (!stub) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(64 << 20);
      args.SetMaxSendMessageSize(64 << 20);
      stub = pb::ClusterPeer::NewStub(grpc::CreateCustomChannel(address, creds_, args));
    }
    return stub.get();
  }
  void Prepare(grpc::ClientContext& ctx) const {
    if (!secret_.empty()) ctx.AddMetadata(wire::kPeerCredentialMetadata, secret_);
    ctx.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  }

 private:
  std::string secret_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  Mutex mu_;
  std::map<std::string, std::unique_ptr<pb::ClusterPeer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

ClusterRepair::ClusterRepair(RepairOptions options, storage::ChunkStore* store,
                             NamespaceRegistry* registry,
                             std::unique_ptr<cluster::MembershipView> view)
    : opt_(std::move(options)),
      store_(store),
      registry_(registry),
      view_(std::move(view)),
      peers_(std::make_unique<Peers>(opt_.secret, opt_.tls_roots_pem)) {
  if (!opt_.log) opt_.log = [](const std::string&, const std::string&) {};
  stats_.set_pending(true);  // a node that starts has not checked its chunks yet
  thread_ = std::thread([this] { Loop(); });
}

ClusterRepair::~ClusterRepair() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

RepairStats ClusterRepair::stats() const {
  MutexLock lk(mu_);
  return stats_;
}

bool ClusterRepair::ShouldStop(bool draining, uint64_t membership_version) const {
  {
    MutexLock lk(mu_);
    if (stop_) return true;
    if (!draining && draining_) return true;  // a drain takes over
  }
  return !draining && view_->Current()->version != membership_version;
}

void ClusterRepair::Loop() {
  uint64_t seen_version = 0;
  Clock::time_point changed_at = Clock::now();  // starting counts as a change
  Clock::time_point last_pass = Clock::now();
  bool pending = true;
  for (;;) {
    {
      MutexLock lk(mu_);
      if (!stop_) cv_.wait_for(mu_, std::chrono::milliseconds(200));  // a poll: early is fine
      if (stop_) return;
      if (draining_) continue;
    }
    std::shared_ptr<const cluster::MembershipView::Snapshot> snap = view_->Current();
    if (snap->version != seen_version) {
      seen_version = snap->version;
      changed_at = Clock::now();
      pending = true;
      MutexLock lk(mu_);
      stats_.set_pending(true);
    }
    if (snap->stale) continue;  // etcd away: the membership may be old; wait for it
    const bool registered = std::any_of(snap->nodes.begin(), snap->nodes.end(),
                                        [&](const auto& n) { return n.id == opt_.self_id; });
    if (!registered) continue;
    const bool due = pending ? SecondsSince(changed_at) >= opt_.grace_s
                             : opt_.interval_s > 0 && SecondsSince(last_pass) >= opt_.interval_s;
    if (!due) continue;
    MutexLock pass(pass_mu_);
    absl::Status s = RunPass(snap->nodes, /*draining=*/false, snap->version);
    last_pass = Clock::now();
    if (s.ok()) {
      pending = false;
    } else if (!absl::IsAborted(s)) {
      // Some copy failed (an owner down, a full disk): try again after another grace.
      changed_at = Clock::now();
      opt_.log("repair_pass_incomplete", std::string(s.message()));
    }
  }
}

absl::Status ClusterRepair::Drain() {
  {
    MutexLock lk(mu_);
    draining_ = true;
  }
  MutexLock pass(pass_mu_);  // a background pass in flight stops at its next step
  return RunPass(view_->Current()->nodes, /*draining=*/true, 0);
}

absl::Status ClusterRepair::RunPass(const std::vector<cluster::NodeInfo>& members, bool draining,
                                    uint64_t membership_version) {
  const Clock::time_point start = Clock::now();
  std::vector<std::string> ids, addresses;
  for (const cluster::NodeInfo& m : members) {
    if (draining && m.id == opt_.self_id) continue;
    ids.push_back(m.id);
    addresses.push_back(m.address);
  }
  if (ids.empty()) return absl::FailedPreconditionError("no other node to hand chunks to");
  const auto self_at = std::find(ids.begin(), ids.end(), opt_.self_id);
  const size_t self =
      self_at == ids.end() ? ids.size() : static_cast<size_t>(self_at - ids.begin());
  const size_t replicas = std::min(std::max<size_t>(opt_.replicas, 1), ids.size());

  std::map<uint32_t, NamespaceInfo> namespaces;  // by store_id, as storage lists chunks
  for (NamespaceInfo& ns : registry_->All()) namespaces.emplace(ns.store_id, std::move(ns));
  // The chunks in shards of about shard_chunks (by key), each listed, asked about and
  // copied before the next is listed: a pass holds one shard's listing, not the store's.
  const storage::StoreStats held = store_->Stats();
  const auto shards = static_cast<uint32_t>(std::max<uint64_t>(
      1, (held.ram_chunks + held.ssd_chunks) / std::max<uint64_t>(opt_.shard_chunks, 1)));
  uint64_t unplaceable = 0, under = 0, under_bytes = 0, copied = 0, copied_bytes = 0, failures = 0,
           dropped = 0, left_to_shared = 0;
  std::set<size_t> unreachable;
  {
    MutexLock lk(mu_);
    stats_.set_running(true);
    stats_.set_progress(0);
    stats_.set_under_replicated_chunks(0);
    stats_.set_under_replicated_bytes(0);
    stats_.set_left_to_shared_tier_chunks(0);
  }
  opt_.log("repair_pass_start",
           absl::StrCat(held.ram_chunks + held.ssd_chunks, " chunks (", shards, " shards) over ",
                        ids.size(), " nodes", draining ? " (draining)" : ""));
  auto finish = [&](absl::Status s) {
    MutexLock lk(mu_);
    stats_.set_running(false);
    stats_.set_unplaceable_chunks(unplaceable);
    if (s.ok()) {
      stats_.set_passes(stats_.passes() + 1);
      stats_.set_last_pass_unix_s(WallSeconds());
      stats_.set_pending(false);
      stats_.set_progress(1);
    }
    return s;
  };
  for (uint32_t shard = 0; shard < shards; ++shard) {
    const std::vector<storage::ChunkStore::ChunkListing> chunks = store_->ListChunks(shard, shards);

    // Each placeable chunk, its owners (indices into ids, best first) and which of them
    // answered that they hold it (bit k: owners[k]).
    struct Item {
      const storage::ChunkStore::ChunkListing* chunk;
      const NamespaceInfo* ns;
      std::vector<size_t> owners;
      uint32_t holds = 0;
      uint32_t shared = 0;  // of holds: the owners that hold it only in the shared tier
      int copies_left = 0;
      bool deleted = false;  // an owner says its tenant deleted it there
    };
    std::vector<Item> items;
    const int64_t now_s = WallSeconds();
    for (const storage::ChunkStore::ChunkListing& c : chunks) {
      auto ns = namespaces.find(c.namespace_id);
      if (!c.origin || ns == namespaces.end() || ns->second.key_scope < kKeyScopeBound) {
        ++unplaceable;
        continue;
      }
      if (c.expires_s != 0 && c.expires_s <= now_s) continue;  // going anyway
      items.push_back({&c, &ns->second, cluster::TopRanked(c.origin->key, ids, replicas)});
    }
    // 1. Ask each owner, per namespace, which of its chunks it holds.
    std::map<std::pair<size_t, uint32_t>, std::vector<std::pair<size_t, size_t>>> asks;
    for (size_t i = 0; i < items.size(); ++i) {
      for (size_t k = 0; k < items[i].owners.size(); ++k) {
        if (items[i].owners[k] != self)
          asks[{items[i].owners[k], items[i].ns->store_id}].push_back({i, k});
      }
    }
    for (const auto& [where, list] : asks) {
      const auto [node, ns_id] = where;
      if (unreachable.contains(node)) continue;
      for (size_t at = 0; at < list.size() && !unreachable.contains(node);
           at += kHoldsKeysPerCall) {
        if (ShouldStop(draining, membership_version)) return finish(absl::AbortedError("stopped"));
        const size_t n = std::min(kHoldsKeysPerCall, list.size() - at);
        pb::HoldsRequest req;
        *req.mutable_ns() = ToPeer(namespaces.at(ns_id));
        std::string* packed = req.mutable_packed_chunk_keys();
        packed->reserve(n * 16);
        for (size_t j = at; j < at + n; ++j)
          packed->append(wire::KeyBytes(items[list[j].first].chunk->origin->key));
        pb::HoldsResponse resp;
        grpc::ClientContext ctx;
        peers_->Prepare(ctx);
        grpc::Status s = peers_->Stub(addresses[node])->Holds(&ctx, req, &resp);
        if (!s.ok() || static_cast<size_t>(resp.tiers_size()) != n) {
          unreachable.insert(node);
          ++failures;
          opt_.log("repair_ask_failed",
                   absl::StrCat(ids[node], " (", addresses[node],
                                "): ", s.ok() ? "answer of the wrong length" : s.error_message()));
          break;
        }
        for (size_t j = 0; j < n; ++j) {
          const pb::Tier tier = resp.tiers(static_cast<int>(j));
          if (tier != pb::TIER_NONE) items[list[at + j].first].holds |= 1u << list[at + j].second;
          if (tier == pb::TIER_RADOS) items[list[at + j].first].shared |= 1u << list[at + j].second;
        }
        for (uint32_t j : resp.deleted()) {
          if (j < n) items[list[at + j].first].deleted = true;
        }
      }
    }

    // 2. Who lacks what, and whether this node is the one to copy it.
    std::map<std::pair<size_t, uint32_t>, std::vector<size_t>> copies;  // (owner, ns) → items
    std::map<uint32_t, std::vector<ChunkKey>> extra;    // ns → stored keys of copies to drop
    std::map<uint32_t, std::vector<ChunkKey>> deleted;  // ns → stored keys deleted elsewhere
    const uint64_t under_before = under, under_bytes_before = under_bytes,
                   left_to_shared_before = left_to_shared;
    uint64_t copies_planned = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      Item& it = items[i];
      if (it.deleted) {  // this node missed its tenant's Delete: the copy goes, not out
        deleted[it.ns->store_id].push_back(it.chunk->key);
        continue;
      }
      uint32_t holders = it.holds;
      size_t self_rank = it.owners.size();
      for (size_t k = 0; k < it.owners.size(); ++k) {
        if (it.owners[k] == self) {
          self_rank = k;
          holders |= 1u << k;
        }
      }
      std::vector<size_t> missing;
      for (size_t k = 0; k < it.owners.size(); ++k) {
        if (!(holders & (1u << k)) && !unreachable.contains(it.owners[k]))
          missing.push_back(it.owners[k]);
      }
      if (missing.empty() && it.shared != 0) {
        // Owners lack a copy of their own, but the shared tier (RADOS) holds the durable
        // one: nothing is copied — an owner reads it from there, and keeps it, when asked.
        // Counted by the node that would copy it (the best-ranked owner with a copy here).
        const uint32_t local = holders & ~it.shared;
        if (self_rank < it.owners.size() ? (local & ((1u << self_rank) - 1)) == 0
                                         : (it.holds & ~it.shared) == 0)
          ++left_to_shared;
      }
      if (missing.empty()) {
        // Not an owner, and every owner has it: this copy is an extra one.
        const uint32_t all = it.owners.size() >= 32 ? ~0u : (1u << it.owners.size()) - 1;
        // A pinned copy is never dropped: Holds tells whether an owner holds the chunk, not
        // whether it holds it pinned (a copy may arrive unpinned at its tenant's pin limit),
        // so the pin would be gone everywhere. It goes when its pin ends, as any chunk.
        const bool pinned = it.chunk->pin_until_s > now_s;
        if (opt_.drop_extra_copies && !draining && !pinned && self_rank == it.owners.size() &&
            (it.holds & all) == all) {
          extra[it.ns->store_id].push_back(it.chunk->key);
        }
        continue;
      }
      bool copier;
      if (draining) {
        copier = true;
      } else if (self_rank < it.owners.size()) {
        copier = (holders & ((1u << self_rank) - 1)) == 0;  // no better-ranked owner holds it
      } else {
        copier = it.holds == 0;  // an extra copy: only when no owner has one
      }
      if (!copier) continue;
      ++under;
      under_bytes += it.chunk->payload_bytes;
      it.copies_left = static_cast<int>(missing.size());
      copies_planned += missing.size();
      for (size_t owner : missing) copies[{owner, it.ns->store_id}].push_back(i);
    }
    {
      MutexLock lk(mu_);
      stats_.set_under_replicated_chunks(stats_.under_replicated_chunks() + under - under_before);
      stats_.set_under_replicated_bytes(stats_.under_replicated_bytes() + under_bytes -
                                        under_bytes_before);
      stats_.set_left_to_shared_tier_chunks(stats_.left_to_shared_tier_chunks() + left_to_shared -
                                            left_to_shared_before);
    }

    // 3. Copy, in calls of up to max_copy_bytes, at no more than bytes_per_s.
    uint64_t copies_done = 0;
    for (const auto& [where, list] : copies) {
      const auto [node, ns_id] = where;
      const NamespaceInfo& ns = namespaces.at(ns_id);
      const size_t per_call =
          std::max<size_t>(1, opt_.max_copy_bytes / std::max<uint64_t>(ns.chunk_bytes, 1));
      for (size_t at = 0; at < list.size(); at += per_call) {
        if (ShouldStop(draining, membership_version)) return finish(absl::AbortedError("stopped"));
        const size_t n = std::min(per_call, list.size() - at);
        pb::ReplicateRequest req;
        *req.mutable_ns() = ToPeer(ns);
        std::vector<ChunkKey> keys;
        std::vector<std::span<uint8_t>> outs;
        for (size_t j = at; j < at + n; ++j) {
          const storage::ChunkStore::ChunkListing& c = *items[list[j]].chunk;
          pb::ReplicaChunk* rc = req.add_chunks();
          rc->set_chunk_key(wire::KeyBytes(c.origin->key));
          if (c.origin->parent) rc->set_parent_key(wire::KeyBytes(*c.origin->parent));
          // The stored checksum, not one of the bytes read: a copy damaged here is refused there.
          rc->set_checksum(c.checksum);
          rc->set_expires_unix_s(c.expires_s);
          rc->set_pin_until_unix_s(c.pin_until_s);
          rc->mutable_payload()->resize(c.payload_bytes);
          keys.push_back(c.key);
          outs.emplace_back(reinterpret_cast<uint8_t*>(rc->mutable_payload()->data()),
                            c.payload_bytes);
        }
        // Read (every SSD read verified); a chunk gone since the listing is left out — its
        // copy is settled too: there is nothing left to copy.
        const std::vector<absl::Status> read = store_->GetBatch(ns_id, keys, outs);
        std::vector<size_t> sent, gone;
        for (size_t j = n; j-- > 0;) {
          if (read[j].ok()) {
            sent.push_back(list[at + j]);
          } else {
            gone.push_back(list[at + j]);
            req.mutable_chunks()->DeleteSubrange(static_cast<int>(j), 1);
          }
        }
        copies_done += n;
        grpc::Status s;
        if (!sent.empty()) {
          pb::ReplicateResponse resp;
          grpc::ClientContext ctx;
          peers_->Prepare(ctx);
          s = peers_->Stub(addresses[node])->Replicate(&ctx, req, &resp);
        }
        uint64_t bytes = 0;
        for (size_t i : sent) bytes += items[i].chunk->payload_bytes;
        MutexLock lk(mu_);
        // One copy of the item made (or no longer possible): the chunk is no longer short
        // once its last copy is.
        auto settle = [&](Item& it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          if (--it.copies_left == 0) {
            stats_.set_under_replicated_chunks(stats_.under_replicated_chunks() - 1);
            stats_.set_under_replicated_bytes(stats_.under_replicated_bytes() -
                                              it.chunk->payload_bytes);
          }
        };
        for (size_t i : gone) settle(items[i]);
        if (!s.ok()) {
          ++failures;
          stats_.set_failed_copies(stats_.failed_copies() + sent.size());
          opt_.log("repair_copy_failed", absl::StrCat(sent.size(), " chunks to ", ids[node], " (",
                                                      addresses[node], "): ", s.error_message()));
        } else {
          copied += sent.size();
          copied_bytes += bytes;
          stats_.set_copied_chunks(stats_.copied_chunks() + sent.size());
          stats_.set_copied_bytes(stats_.copied_bytes() + bytes);
          for (size_t i : sent) settle(items[i]);
        }
        const double elapsed = SecondsSince(start);
        stats_.set_copy_bytes_per_s(elapsed > 0 ? copied_bytes / elapsed : 0);
        stats_.set_progress(
            (shard + (copies_planned ? static_cast<double>(copies_done) / copies_planned : 1)) /
            shards);
        if (opt_.bytes_per_s > 0) {  // hold the pass to its bandwidth
          const double due =
              static_cast<double>(copied_bytes) / static_cast<double>(opt_.bytes_per_s);
          if (due > elapsed) {
            WaitForFlag(cv_, mu_, stop_,
                        std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(due - elapsed)));
          }
        }
      }
    }
    // 4. Erase what was deleted while this node was away (remembering it, so that no copy
    // comes back here either), and drop the extra copies every owner confirmed.
    for (const auto& [ns_id, keys] : deleted) {
      if (opt_.tombstones != nullptr) {
        if (absl::Status s = opt_.tombstones->Add(ns_id, keys); !s.ok()) {
          opt_.log("repair_tombstone_failed", std::string(s.message()));
        }
      }
      uint64_t erased = 0;
      for (const absl::Status& s : store_->EraseBatch(ns_id, keys)) erased += s.ok();
      opt_.log("repair_erased_deleted",
               absl::StrCat(erased, " copies of namespace ", ns_id,
                            " deleted by their tenant while this node was away"));
    }
    uint64_t dropped_here = 0;
    for (const auto& [ns_id, keys] : extra) {
      for (const absl::Status& s : store_->EraseBatch(ns_id, keys)) dropped_here += s.ok();
    }
    if (dropped_here > 0) {
      dropped += dropped_here;
      MutexLock lk(mu_);
      stats_.set_dropped_copies(stats_.dropped_copies() + dropped_here);
    }
  }  // shard
  opt_.log("repair_pass_done",
           absl::StrCat(copied, " copies (", copied_bytes, " bytes) in ", SecondsSince(start),
                        " s; ", under, " chunks were short of copies; ", dropped,
                        " extra copies dropped; ", failures, " failures"));
  if (failures > 0 || !unreachable.empty()) {
    (void)finish(absl::OkStatus());  // counted as a pass, but the membership stays pending
    MutexLock lk(mu_);
    stats_.set_pending(true);
    return absl::UnavailableError(absl::StrCat(failures, " repair calls failed"));
  }
  return finish(absl::OkStatus());
}

}  // namespace kvc::cachesvc
