// kvctl: the kvcache admin CLI.
//
// Against a running kvcached (--server ADDR, --token T) or a cluster (--server etcd://H:P):
//   kvctl stats [--cluster etcd://H:P]   (a cluster: membership, then every node's tiers
//                                         and repair state)
//   kvctl drain NODE --cluster etcd://H:P --cluster-secret-file F   (a node leaves cleanly)
//   kvctl register --config F --model-id M [--chunk-tokens C]
//   kvctl hash     --config F --model-id M [--chunk-tokens C] --tokens-file F
//   kvctl lookup   --config F --model-id M [--chunk-tokens C] --tokens-file F
//   kvctl put      --config F --model-id M [--chunk-tokens C] --tokens-file F
//                  --payload-file P [--memory] [--ttl S]
//   kvctl get      --config F --model-id M [--chunk-tokens C] --tokens-file F --out P
//   kvctl pin|unpin|evict --config F --model-id M [--chunk-tokens C] --tokens-file F
//                  [--ttl S]
//   kvctl pins --tenant T [--limit N]   (the operator: a tenant's pinned chunks)
//   kvctl unpin --tenant T              (the operator: every pin of a tenant removed)
// On a stopped daemon's data folder:
//   kvctl ls     --data-dir DIR      (namespace and stored key of every chunk on SSD: keys as
//                                    storage holds them, bound to their namespace)
//   kvctl verify --data-dir DIR      (reads every chunk on SSD and checks its checksum)
// Token files hold whitespace-separated token ids; payload files the chunks' bytes back
// to back.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "cachesvc/etcd_flags.h"
#include "client/client.h"
#include "client/cluster_client.h"
#include "client/stats.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "kvcache/v1/peer.grpc.pb.h"
#include "programs/command_line.h"
#include "storage/chunk_store.h"
#include "wire/grpc_status.h"
#include "wire/wire.h"

namespace kvc::cachesvc {
namespace {

namespace pb = ::kvcache::v1;
using client::CacheApi;
using client::CacheClient;
using client::ClientOptions;
using client::ClusterClient;
using client::ConnectCache;
using client::Durability;
using client::LookupResult;
using client::RemoteNamespace;
using client::StoreResult;

absl::StatusOr<std::vector<uint32_t>> ReadTokens(const std::string& path) {
  KVC_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::istringstream in(text);
  std::vector<uint32_t> tokens;
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(word.c_str(), &end, 10);
    if (*end != '\0' || v > 0xFFFFFFFFul) {
      return absl::InvalidArgumentError("\"" + path + "\": token " + std::to_string(tokens.size()) +
                                        " is \"" + word + "\", not a token id");
    }
    tokens.push_back(static_cast<uint32_t>(v));
  }
  return tokens;
}

// A one-line progress bar on stderr for long work.
void Progress(size_t done, size_t total) {
  const int width = 40;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), done, total);
  if (done == total) std::fprintf(stderr, "\n");
}

struct Args {
  std::string server = "127.0.0.1:50051", cluster, token, config, model_id, tokens_file,
              payload_file, out, data_dir;
  uint32_t chunk_tokens = 0, ttl = 0;
  bool memory = false;
  std::string node_id, secret_file;  // drain
  std::string tenant;                // pins, unpin --tenant: the operator's
  uint32_t limit = 1000;
  std::string tls_ca;  // reach kvcached over TLS, trusting this CA bundle
  double wait_s = 3600;
  EtcdFlags etcd;  // a cluster whose etcd runs with TLS or authentication
};

// The membership as etcd has it, then one line per node: its tiers and how its reads went.
absl::Status PrintClusterStats(ClusterClient& c) {
  const std::shared_ptr<const ClusterClient::Membership> m = c.membership();
  std::printf("cluster: %zu nodes, %u copies per chunk, membership %s%s%s\n", m->nodes.size(),
              c.replicas(), m->stale ? "STALE (etcd unreachable: " : "current",
              m->stale ? m->stale_reason.c_str() : "", m->stale ? ")" : "");
  std::printf("%-16s %-22s %4s %15s %15s %8s %8s %8s %6s\n", "node", "address", "gen", "ram chunks",
              "ssd chunks", "ram hits", "ssd hits", "misses", "hit %");
  size_t down = 0;
  for (const client::NodeStats& n : c.Stats()) {
    if (!n.stats.ok()) {
      ++down;
      std::printf("%-16s %-22s %4llu  unreachable: %s\n", n.node.id.c_str(), n.node.address.c_str(),
                  (unsigned long long)n.node.generation,
                  std::string(n.stats.status().message()).c_str());
      continue;
    }
    const pb::StatsResponse& s = *n.stats;
    const uint64_t hits = s.ram_hits() + s.ssd_hits() + s.hbm_hits();
    const uint64_t asked = hits + s.misses();
    std::printf("%-16s %-22s %4llu %7llu/%-7llu %7llu/%-7llu %8llu %8llu %8llu %6.1f\n",
                n.node.id.c_str(), n.node.address.c_str(), (unsigned long long)n.node.generation,
                (unsigned long long)s.ram_chunks(), (unsigned long long)s.ram_capacity_chunks(),
                (unsigned long long)s.ssd_chunks(), (unsigned long long)s.ssd_capacity_chunks(),
                (unsigned long long)s.ram_hits(), (unsigned long long)s.ssd_hits(),
                (unsigned long long)s.misses(), asked ? 100.0 * hits / asked : 0.0);
  }
  // Repair (docs/cluster.md, "Repair"): what each node still has to copy, what it copied,
  // and when it last checked all its chunks. Shown to tenants that see the daemon's totals.
  std::printf("\n%-16s %8s %14s %14s %12s %10s %8s %6s %s\n", "repair", "state", "under-repl.",
              "bytes", "copied", "MB/s", "failed", "passes", "last full pass");
  uint64_t under = 0, under_bytes = 0, left_to_shared = 0;
  bool any_repair = false;
  for (const client::NodeStats& n : c.Stats()) {
    if (!n.stats.ok() || !n.stats->has_repair()) continue;
    any_repair = true;
    const pb::RepairStats& r = n.stats->repair();
    under += r.under_replicated_chunks();
    under_bytes += r.under_replicated_bytes();
    left_to_shared += r.left_to_shared_tier_chunks();
    const std::string state = r.running()
                                  ? absl::StrCat("run ", static_cast<int>(100 * r.progress()), "%")
                              : r.pending() ? "pending"
                                            : "idle";
    const std::string last =
        r.last_pass_unix_s() > 0
            ? absl::StrCat(static_cast<int64_t>(time(nullptr)) - r.last_pass_unix_s(), " s ago")
            : "none yet";
    std::printf("%-16s %8s %14llu %14llu %12llu %10.1f %8llu %6llu %s\n", n.node.id.c_str(),
                state.c_str(), (unsigned long long)r.under_replicated_chunks(),
                (unsigned long long)r.under_replicated_bytes(),
                (unsigned long long)r.copied_chunks(), r.copy_bytes_per_s() / 1e6,
                (unsigned long long)r.failed_copies(), (unsigned long long)r.passes(),
                last.c_str());
  }
  if (any_repair) {
    std::printf("%-16s %8s %14llu %14llu\n", "cluster", "", (unsigned long long)under,
                (unsigned long long)under_bytes);
    if (left_to_shared > 0) {
      std::printf(
          "%llu chunks short of a copy on an owner are in the shared tier (not copied: "
          "read from it when asked)\n",
          (unsigned long long)left_to_shared);
    }
  } else {
    std::printf("(no node reported repair: single daemons, or a token that sees no totals)\n");
  }
  if (down > 0) return absl::UnavailableError(absl::StrCat(down, " nodes did not answer Stats"));
  return absl::OkStatus();
}

// kvctl drain NODE: asks the node (ClusterPeer.Drain, with the cluster credential) to hand its
// chunks over and leave, then waits until it has left the membership.
absl::Status DrainNode(ClusterClient& c, const std::string& node_id, const std::string& secret_file,
                       const std::string& tls_ca, double wait_s) {
  std::string secret;
  if (!secret_file.empty()) {
    KVC_ASSIGN_OR_RETURN(secret, ReadSecretFile(secret_file));
  }
  std::string address;
  for (const cluster::NodeInfo& n : c.membership()->nodes) {
    if (n.id == node_id) address = n.address;
  }
  if (address.empty()) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " is not in the cluster"));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    KVC_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(tls_ca));
    creds = grpc::SslCredentials(ssl);
  }
  auto stub = pb::ClusterPeer::NewStub(grpc::CreateChannel(address, creds));
  grpc::ClientContext ctx;
  if (!secret.empty()) ctx.AddMetadata(wire::kPeerCredentialMetadata, secret);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::DrainRequest req;
  pb::DrainResponse resp;
  if (grpc::Status st = stub->Drain(&ctx, req, &resp); !st.ok()) {
    const absl::Status s = wire::FromGrpc(st);
    return absl::Status(s.code(),
                        absl::StrCat("node ", node_id, " (", address, "): ", s.message()));
  }
  std::printf("%s: draining %llu chunks\n", node_id.c_str(), (unsigned long long)resp.chunks());
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto m = c.membership();
    if (!m->stale && std::none_of(m->nodes.begin(), m->nodes.end(),
                                  [&](const cluster::NodeInfo& n) { return n.id == node_id; })) {
      std::printf("%s: handed over and left the cluster after %.1f s\n", node_id.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      return absl::OkStatus();
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(wait_s)) {
      return absl::DeadlineExceededError(
          absl::StrCat(node_id, " is still in the cluster after ", wait_s, " s (still copying?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// The operator's calls on a tenant's pins, against one daemon (--server): the caller's
// token must be an admin tenant's (kvcached --admin-tenants).
absl::Status TenantPins(const Args& a, bool unpin) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!a.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    KVC_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(a.tls_ca));
    creds = grpc::SslCredentials(ssl);
  }
  auto stub = pb::KVCache::NewStub(grpc::CreateChannel(a.server, creds));
  grpc::ClientContext ctx;
  if (!a.token.empty()) ctx.AddMetadata("authorization", "Bearer " + a.token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (unpin) {
    pb::UnpinTenantRequest req;
    req.set_tenant(a.tenant);
    pb::UnpinResponse resp;
    KVC_RETURN_IF_ERROR(wire::FromGrpc(stub->UnpinTenant(&ctx, req, &resp)));
    std::printf("unpinned %u chunks of tenant %s\n", resp.unpinned(), a.tenant.c_str());
    return absl::OkStatus();
  }
  pb::ListPinsRequest req;
  req.set_tenant(a.tenant);
  req.set_limit(a.limit);
  pb::ListPinsResponse resp;
  KVC_RETURN_IF_ERROR(wire::FromGrpc(stub->ListPins(&ctx, req, &resp)));
  std::printf("tenant %s has %u pinned chunks%s\n", a.tenant.c_str(), resp.total(),
              static_cast<uint32_t>(resp.pins_size()) < resp.total() ? " (the first listed)" : "");
  for (const pb::PinnedChunk& p : resp.pins()) {
    storage::ChunkKey key;
    if (p.chunk_key().size() == 16) std::memcpy(key.bytes.data(), p.chunk_key().data(), 16);
    std::printf("namespace %u (%s) %s until %lld\n", p.namespace_id(), p.model_id().c_str(),
                key.Hex().c_str(), static_cast<long long>(p.pin_until_unix_s()));
  }
  return absl::OkStatus();
}

// kvctl ls|verify: on a stopped daemon's data folder, opened with its own geometry.
absl::Status FolderCommand(const std::string& cmd, const Args& a) {
  storage::StoreOptions o;
  o.data_dir = a.data_dir;
  o.max_chunk_bytes = 0;  // the folder's own geometry
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkStore> store, storage::ChunkStore::Open(o));
  const auto chunks = store->ListSsd();
  if (cmd == "ls") {
    std::map<storage::NamespaceId, size_t> per_ns;
    for (const auto& [ns, key] : chunks) {
      std::printf("%u %s\n", ns, key.Hex().c_str());
      ++per_ns[ns];
    }
    for (const auto& [ns, n] : per_ns) std::fprintf(stderr, "namespace %u: %zu chunks\n", ns, n);
    return absl::OkStatus();
  }
  size_t bad = 0, done = 0;
  std::vector<uint8_t> buf;
  for (const auto& [ns, key] : chunks) {
    KVC_ASSIGN_OR_RETURN(uint64_t bytes, store->ChunkBytes(ns));
    buf.resize(bytes);
    absl::Status st = store->Get(ns, key, buf);  // verifies; a bad chunk is dropped
    if (!st.ok()) {
      ++bad;
      std::fprintf(stderr, "\n%s\n", std::string(st.message()).c_str());
    }
    if (++done % 64 == 0 || done == chunks.size()) Progress(done, chunks.size());
  }
  std::printf("verified %zu chunks: %zu good, %zu bad (dropped)\n", chunks.size(),
              chunks.size() - bad, bad);
  return bad == 0 ? absl::OkStatus()
                  : absl::DataLossError(std::to_string(bad) + " chunks failed verification");
}

// kvctl stats against one daemon: its tiers, scrub, shared tier and the caller's quota.
absl::Status PrintNodeStats(CacheClient& client) {
  KVC_ASSIGN_OR_RETURN(pb::StatsResponse s, client.Stats());
  std::printf(
      "ram  %llu / %llu chunks\nssd  %llu / %llu chunks\nhits ram %llu, ssd %llu; misses %llu\n"
      "checksum failures %llu, evictions %llu, io %s\n",
      (unsigned long long)s.ram_chunks(), (unsigned long long)s.ram_capacity_chunks(),
      (unsigned long long)s.ssd_chunks(), (unsigned long long)s.ssd_capacity_chunks(),
      (unsigned long long)s.ram_hits(), (unsigned long long)s.ssd_hits(),
      (unsigned long long)s.misses(), (unsigned long long)s.checksum_failures(),
      (unsigned long long)s.evictions(), s.io_backend().c_str());
  std::printf(
      "ssd io errors: read %llu, write %llu; at the last start %llu chunks were "
      "indexed from their slots%s\n",
      (unsigned long long)s.read_errors(), (unsigned long long)s.write_errors(),
      (unsigned long long)s.recovered_chunks(),
      s.index_rebuilds() > 0 ? " (the index was damaged and rebuilt)" : "");
  const int64_t since = s.ram_scrub_last_pass_unix_s() > 0
                            ? static_cast<int64_t>(time(nullptr)) - s.ram_scrub_last_pass_unix_s()
                            : -1;
  std::printf(
      "ram scrub: %llu passes, %.1f MB verified, last pass %s, current pass %.0f%%; "
      "corrupt RAM copies dropped %llu\n",
      (unsigned long long)s.ram_scrub_passes(), s.ram_scrub_bytes() / 1e6,
      since < 0 ? "never" : (std::to_string(since) + " s ago").c_str(),
      100 * s.ram_scrub_progress(), (unsigned long long)s.ram_checksum_failures());
  if (s.has_shared_tier()) {
    const pb::SharedTierStats& t = s.shared_tier();
    std::printf(
        "shared tier %s (%s): %s; puts %llu (failed %llu), hits %llu, misses %llu, read "
        "errors %llu, backlog %llu chunks%s%s\n",
        t.name().c_str(), t.write_behind() ? "write-behind" : "write-through",
        t.reachable() ? "answering" : "NOT ANSWERING", (unsigned long long)t.puts(),
        (unsigned long long)t.put_errors(), (unsigned long long)t.hits(),
        (unsigned long long)t.misses(), (unsigned long long)t.read_errors(),
        (unsigned long long)t.backlog_chunks(),
        t.last_error().empty() ? "" : "; last error: ", t.last_error().c_str());
  }
  if (s.has_quota()) {
    const pb::TenantQuota& q = s.quota();
    auto limit = [](uint64_t x) { return x > 0 ? std::to_string(x) : std::string("none"); };
    std::printf("quota: ram %llu / %s bytes, ssd %llu / %s bytes, pins %llu / %s",
                (unsigned long long)q.ram_bytes(), limit(q.ram_bytes_limit()).c_str(),
                (unsigned long long)q.ssd_bytes(), limit(q.ssd_bytes_limit()).c_str(),
                (unsigned long long)q.pinned_chunks(), limit(q.pinned_chunks_limit()).c_str());
    if (s.has_shared_tier()) {
      if (q.rados_error().empty()) {
        std::printf(", rados %llu / %s bytes", (unsigned long long)q.rados_bytes(),
                    limit(q.rados_bytes_limit()).c_str());
      } else {
        std::printf(", rados ? / %s bytes (%s)", limit(q.rados_bytes_limit()).c_str(),
                    q.rados_error().c_str());
      }
    }
    std::printf("\n");
  }
  return absl::OkStatus();
}

// The commands on a token file's chunks: register, hash, lookup, put, get, pin, unpin, evict.
absl::Status ChunkCommand(const std::string& cmd, const Args& a, CacheApi& client) {
  KVC_ASSIGN_OR_RETURN(std::string config, ReadFile(a.config));
  KVC_ASSIGN_OR_RETURN(RemoteNamespace ns,
                       client.RegisterNamespace(config, a.model_id, a.chunk_tokens));
  if (cmd == "register") {
    std::printf("namespace %u: %u tokens and %llu bytes per chunk, root %s\n", ns.id,
                ns.chunk_tokens, (unsigned long long)ns.chunk_bytes, ns.root.Hex().c_str());
    return absl::OkStatus();
  }
  KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> tokens, ReadTokens(a.tokens_file));
  KVC_ASSIGN_OR_RETURN(LookupResult found, client.Lookup(ns, tokens));
  if (cmd == "lookup") {
    std::printf("matched %u of %zu chunks (%llu tokens)\n", found.matched_chunks, found.keys.size(),
                static_cast<unsigned long long>(found.matched_chunks) * ns.chunk_tokens);
    return absl::OkStatus();
  }
  if (cmd == "hash") {
    for (size_t i = 0; i < found.keys.size(); ++i) {
      std::printf("%zu %s %s\n", i, found.keys[i].Hex().c_str(),
                  i < found.matched_chunks ? client::TierName(found.tiers[i]) : "-");
    }
    return absl::OkStatus();
  }
  if (cmd == "put") {
    KVC_ASSIGN_OR_RETURN(std::string payload, ReadFile(a.payload_file));
    const size_t chunks = tokens.size() / ns.chunk_tokens;
    if (payload.size() != chunks * ns.chunk_bytes) {
      return absl::InvalidArgumentError("\"" + a.payload_file + "\" is " +
                                        std::to_string(payload.size()) + " bytes; " +
                                        std::to_string(chunks) + " chunks of this namespace are " +
                                        std::to_string(chunks * ns.chunk_bytes));
    }
    KVC_ASSIGN_OR_RETURN(
        StoreResult r,
        client.Store(ns, std::nullopt, std::span(tokens).first(chunks * ns.chunk_tokens),
                     std::span(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()),
                     a.memory ? Durability::kMemory : Durability::kDurable, a.ttl));
    std::printf("stored %u, already present %u\n", r.stored, r.already_present);
    return absl::OkStatus();
  }
  if (cmd == "get") {
    std::vector<uint8_t> out(found.matched_chunks * ns.chunk_bytes);
    KVC_ASSIGN_OR_RETURN(size_t n,
                         client.Fetch(ns, std::span(found.keys).first(found.matched_chunks), out));
    std::ofstream f(a.out, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(out.data()),
            static_cast<std::streamsize>(n * ns.chunk_bytes));
    if (!f) return absl::InternalError("cannot write \"" + a.out + "\"");
    std::printf("fetched %zu of %zu chunks\n", n, found.keys.size());
    return absl::OkStatus();
  }
  const std::span<const storage::ChunkKey> keys(found.keys);
  KVC_ASSIGN_OR_RETURN(uint32_t n, cmd == "pin"     ? client.Pin(ns, keys, a.ttl)
                                   : cmd == "unpin" ? client.Unpin(ns, keys)
                                                    : client.Delete(ns, keys));
  std::printf("%s: %u of %zu chunks\n", cmd.c_str(), n, keys.size());
  return absl::OkStatus();
}

absl::Status Run(const std::string& cmd, const Args& a) {
  if (cmd == "pins" || (cmd == "unpin" && !a.tenant.empty())) {
    return TenantPins(a, /*unpin=*/cmd == "unpin");
  }
  if (cmd == "unpin" && (a.config.empty() || a.model_id.empty() || a.tokens_file.empty())) {
    return absl::InvalidArgumentError(
        "unpin needs --config, --model-id and --tokens-file (a tenant's own chunks), or "
        "--tenant T (the operator: every pin of T)");
  }
  if (cmd == "ls" || cmd == "verify") return FolderCommand(cmd, a);
  ClientOptions options;
  options.address = a.cluster.empty() ? a.server : a.cluster;
  options.bearer_token = a.token;
  options.tls_ca_file = a.tls_ca;
  options.timeout_ms = 60000;
  KVC_ASSIGN_OR_RETURN(cluster::EtcdSecurity etcd, a.etcd.Resolve());
  options.etcd = etcd;
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<CacheApi> client, ConnectCache(options));
  if (cmd == "drain") {
    auto* cluster = dynamic_cast<ClusterClient*>(client.get());
    if (cluster == nullptr) return absl::InvalidArgumentError("drain needs --cluster etcd://H:P");
    return DrainNode(*cluster, a.node_id, a.secret_file, a.tls_ca, a.wait_s);
  }
  if (cmd == "stats") {
    if (auto* cluster = dynamic_cast<ClusterClient*>(client.get()); cluster != nullptr) {
      return PrintClusterStats(*cluster);
    }
    return PrintNodeStats(dynamic_cast<CacheClient&>(*client));
  }
  return ChunkCommand(cmd, a, *client);
}

// The global flags and every subcommand with its own.
void AddFlags(CLI::App& app, Args& a) {
  app.require_subcommand(1);
  app.add_option("--server", a.server, "kvcached address, or a cluster's etcd://H:P[,H:P…]")
      ->capture_default_str();
  app.add_option("--token", a.token, "bearer token");
  app.add_option("--tls-ca", a.tls_ca, "reach kvcached over TLS, trusting this CA bundle");
  a.etcd.AddTo(app);
  auto model = [&](CLI::App* s) {
    s->add_option("--config", a.config, "model config.json")->required();
    s->add_option("--model-id", a.model_id, "model id")->required();
    s->add_option("--chunk-tokens", a.chunk_tokens, "tokens per chunk (0: server default)");
  };
  app.add_subcommand("stats", "service statistics (a cluster: every node's)")
      ->add_option("--cluster", a.cluster, "the cluster's etcd://H:P[,H:P…] (instead of --server)");
  {
    CLI::App* d = app.add_subcommand(
        "drain", "a cluster node hands its chunks to their other owners and leaves");
    d->add_option("node", a.node_id, "the node's id")->required();
    d->add_option("--cluster", a.cluster, "the cluster's etcd://H:P[,H:P…] (instead of --server)");
    d->add_option("--cluster-secret-file", a.secret_file,
                  "the cluster credential (kvcached --cluster-secret-file)");
    d->add_option("--wait-seconds", a.wait_s, "give up waiting for the node to leave after this")
        ->capture_default_str();
  }
  model(app.add_subcommand("register", "register (or find) a model's namespace"));
  {
    CLI::App* p = app.add_subcommand("pins", "the operator: the chunks a tenant has pinned");
    p->add_option("--tenant", a.tenant, "the tenant")->required();
    p->add_option("--limit", a.limit, "list at most this many")->capture_default_str();
  }
  for (const char* name : {"hash", "lookup", "put", "get", "pin", "unpin", "evict"}) {
    CLI::App* s = app.add_subcommand(name, std::string(name) + " the chunks of a token file");
    const bool unpin = std::string(name) == "unpin";
    if (unpin) {  // or the operator's: every pin of a tenant
      s->add_option("--tenant", a.tenant, "every pin of this tenant (an admin token)");
      s->add_option("--config", a.config, "model config.json");
      s->add_option("--model-id", a.model_id, "model id");
      s->add_option("--chunk-tokens", a.chunk_tokens, "tokens per chunk (0: server default)");
      s->add_option("--tokens-file", a.tokens_file, "whitespace-separated token ids");
      continue;
    }
    model(s);
    s->add_option("--tokens-file", a.tokens_file, "whitespace-separated token ids")->required();
    if (std::string(name) == "put") {
      s->add_option("--payload-file", a.payload_file, "the chunks' bytes back to back")->required();
      s->add_flag("--memory", a.memory, "acknowledge once in RAM (default: durable)");
    }
    if (std::string(name) == "get") s->add_option("--out", a.out, "output file")->required();
    if (std::string(name) == "put" || std::string(name) == "pin")
      s->add_option("--ttl", a.ttl, "seconds");
  }
  for (const char* name : {"ls", "verify"}) {
    app.add_subcommand(name, std::string(name) + " a stopped daemon's data folder")
        ->add_option("--data-dir", a.data_dir, "data folder")
        ->required();
  }
}

int Main(int argc, char** argv) {
  CLI::App app{"kvctl: kvcache admin CLI"};
  Args a;
  AddFlags(app, a);
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvctl")) return *stop;
  const std::string cmd = app.get_subcommands()[0]->get_name();
  if (cmd == "pin" && a.ttl == 0) {
    std::cerr << "kvctl: error: pin needs --ttl SECONDS\n";
    return 2;
  }
  absl::Status s = Run(cmd, a);
  if (!s.ok()) {
    std::cerr << "kvctl: error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc::cachesvc

int main(int argc, char** argv) { return kvc::cachesvc::Main(argc, argv); }
