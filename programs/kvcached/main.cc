// kvcached: the kvcache daemon. Host-RAM and SSD tiers under a data folder (GPU memory
// and a shared RADOS tier where built in), the kvcache.v1 gRPC service and the standard
// health service on one address.
//
//   kvcached [--data-dir DIR] [--listen HOST:PORT] [--ram-bytes N] [--ssd-bytes N]
//            [--auth-tokens FILE] [--max-chunk-bytes N] [--tls-cert F --tls-key F]
//            [--max-calls-per-tenant N] [--lookup-keys-per-second K] [--tenant-quota
//            TENANT:ram=B,ssd=B,pins=N,rados=B …] [--rados-pool POOL …]
//            [--log-level debug|info|warn|error]
//            [--cluster etcd://H:P[,H:P…] [--advertise H:P] [--node-id NAME]]
//
// The flags (Flags, Add*Flags), then the daemon built step by step (Daemon, Start), then
// the calls served until a signal (Daemon::Stop).
// Human-readable lines on stdout (the first says where it listens); structured logs
// (JSON lines, see cachesvc/log.h) on stderr.
// SIGTERM or SIGINT: stop accepting calls, finish the ones in flight (up to 10 s), flush
// memory-acknowledged chunks to SSD, exit 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/stat.h>
#include <algorithm>
#include <atomic>
#include <thread>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/status_macros.h"
#include "cachesvc/arena_socket.h"
#include "cachesvc/cluster_node.h"
#include "cachesvc/embedded_config.h"
#include "cachesvc/etcd_flags.h"
#include "cachesvc/log.h"
#include "cachesvc/peer_service.h"
#include "cachesvc/repair.h"
#include "cachesvc/service.h"
#include "cachesvc/shared_sweeper.h"
#include "engine/spec/chunk_layout.h"
#include "programs/command_line.h"
#include "storage/disk_space.h"
#if KVC_WITH_RADOS
#include "storage/rados_tier.h"
#endif
#if KVC_WITH_CUDA
#include "kernels/hbm_arena.h"
#endif

namespace kvc::cachesvc {
namespace {

absl::StatusOr<uint64_t> ReferenceChunkBytes() {
  KVC_ASSIGN_OR_RETURN(ModelConfig c,
                       ParseModelConfig(kEmbeddedReferenceConfig, "embedded reference config"));
  KVC_ASSIGN_OR_RETURN(LayerSchedule s, BuildLayerSchedule(c));
  KVC_ASSIGN_OR_RETURN(ChunkLayout l, BuildChunkLayout(c, s, kDefaultChunkTokens));
  return static_cast<uint64_t>(l.chunk_bytes);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Fail(const std::string& message) {
  std::cerr << "kvcached: error: " << message << "\n";
  return 1;
}

// Every tenant's KV is in the data folder: only the daemon's user may read it. New files
// are made 0600 and folders 0700 (umask); a folder made by an older kvcached is tightened
// the same way here, before anything is served from it. Returns how many entries changed.
absl::StatusOr<int> KeepDataPrivate(const std::string& data_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(data_dir, ec);
  if (ec) return absl::InternalError("cannot create the data folder: " + ec.message());
  int changed = 0;
  const auto tighten = [&](const fs::path& p) {
    std::error_code own;  // one entry's trouble must not end the walk
    const fs::file_status st = fs::symlink_status(p, own);
    if (own || fs::is_symlink(st)) return;
    const fs::perms open = fs::perms::group_all | fs::perms::others_all;
    if ((st.permissions() & open) == fs::perms::none) return;
    fs::permissions(p, open, fs::perm_options::remove, own);
    if (!own) ++changed;
  };
  tighten(data_dir);
  for (auto it = fs::recursive_directory_iterator(data_dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    tighten(it->path());
  }
  if (ec) return absl::InternalError("cannot walk the data folder: " + ec.message());
  return changed;
}

// Every flag, with its default (the Add*Flags functions say what each means).
struct Flags {
  std::string data_dir = "kvcached-data", listen = "127.0.0.1:50051", auth_file, tls_cert, tls_key,
              metrics_listen, shm_socket, shm_tenants, admin_tenants;
  uint64_t ram_bytes = 1ull << 30, ssd_bytes = 8ull << 30, max_chunk_bytes = 0, hbm_bytes = 0;
  int hbm_device = 0;
  bool hbm_write_through = false;
  int threads = 4;
  uint32_t max_calls_per_tenant = ServiceOptions{}.max_calls_per_tenant;
  double lookup_keys_per_second =
      kLookupKeysPerSecondPerCore * std::max(1u, std::thread::hardware_concurrency());
  size_t max_leases_per_tenant = ServiceOptions{}.max_ref_leases;
  size_t max_namespaces_per_tenant = 256;
  size_t max_name_bytes = 256, max_registry_bytes_per_tenant = 1 << 20;
  uint64_t default_pin_limit = 4096;
  int64_t tombstone_seconds = 7 * 24 * 3600;
  double max_pinned_share = 0.5;
  std::vector<std::string> tenant_quota;
  EtcdFlags etcd_flags;
  std::string log_level = "info";
  std::string cluster_url, advertise, node_id;
  int lease_seconds = 5;
  std::string cluster_secret_file;
  size_t replicas = 2;
  double repair_grace_s = 30, repair_interval_s = 600;
  uint64_t repair_mbps = 200;
  bool drain_on_term = false, drop_extra_copies = false;
  uint64_t repair_shard_chunks = RepairOptions{}.shard_chunks;
  size_t durable_store_batch = ServiceOptions{}.durable_store_batch;
  size_t durable_store_in_flight = ServiceOptions{}.durable_store_in_flight;
  // The shared tier (docs/rados.md).
  std::string rados_pool, ceph_conf, ceph_user = "admin";
  bool rados_write_behind = false;
  uint64_t rados_backlog_bytes = 256ull << 20;
  uint32_t rados_op_timeout_s = 5;
  double rados_retry_after_s = 5;
  double rados_sweep_s = 3600;
  bool load_index_in_background = true;
  bool prefault_ram = true;
  std::string ram_verify = "scrub";
  uint64_t ram_scrub_mbps = 256;
  uint32_t inject_io_faults = 0;
};

// Where the chunks are kept: the tiers, the chunk size, the storage threads, and how the
// store loads, checks and writes them.
void AddTierFlags(CLI::App& app, Flags& f) {
  app.add_option("--data-dir", f.data_dir, "data folder (created if missing)")
      ->capture_default_str();
  app.add_option("--ram-bytes", f.ram_bytes, "host-RAM tier capacity")->capture_default_str();
  app.add_option("--ssd-bytes", f.ssd_bytes, "SSD tier capacity")->capture_default_str();
  app.add_option("--hbm-bytes", f.hbm_bytes,
                 "HBM tier (GPU memory, mapped by co-located engines over CUDA IPC); 0: none")
      ->capture_default_str();
  app.add_flag("--hbm-write-through", f.hbm_write_through,
               "stored chunks also go to the HBM tier at once (else on their first device fetch)");
  app.add_option("--hbm-device", f.hbm_device, "CUDA device of the HBM tier")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-chunk-bytes", f.max_chunk_bytes,
                 "largest chunk any namespace may use (default: 8 MiB, or the reference model's "
                 "256-token chunk if larger); every size is stored in slots of its own size");
  app.add_option("--threads", f.threads, "storage worker threads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--load-index-in-background,!--no-load-index-in-background",
               f.load_index_in_background,
               "listen before the SSD index is in memory: lookups and fetches read the index "
               "on disk until it is, stores wait for it (a restart's first hit does not wait "
               "on the chunk count; the default. A load that fails stops the daemon, exit 1)");
  app.add_flag("--prefault-ram,!--no-prefault-ram", f.prefault_ram,
               "fault the RAM tier's pages in at start, the default (its memory is taken at once; "
               "fills and promotions of SSD hits then pay no first-touch page faults)");
  app.add_option("--ram-verify", f.ram_verify,
                 "when RAM copies are checked against their checksums: scrub (on entering and "
                 "leaving RAM and by a background scrub, the default) or every-read (also on "
                 "every read; docs/storage.md)")
      ->check(CLI::IsMember({"scrub", "every-read"}))
      ->capture_default_str();
  app.add_option("--ram-scrub-mbps", f.ram_scrub_mbps,
                 "the background scrub's rate over every RAM copy, MB/s (0: off)")
      ->capture_default_str();
  app.add_option("--inject-io-faults", f.inject_io_faults,
                 "soak tests only: about 1 in N SSD operations fails (EIO or ENOSPC on a read, "
                 "a write or a sync, or a short read); never corrupts bytes")
      ->group("");  // hidden from --help
  app.add_option("--durable-store-batch", f.durable_store_batch,
                 "durable chunks of one Store stream written and synced together (1: a sync per "
                 "chunk; the stream's answer always waits for all of them)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--durable-store-in-flight", f.durable_store_in_flight,
                 "batches of one Store stream written at once (2: the next batch is read and "
                 "written while the previous one's sync runs; 1: one batch at a time)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--max-pinned-share", f.max_pinned_share,
                 "share of each tier's slots that pinned chunks may take, all tenants together")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
}

// The shared tier below SSD.
void AddSharedTierFlags(CLI::App& app, Flags& f) {
  app.add_option("--rados-pool", f.rados_pool,
                 "a shared tier below SSD on this Ceph RADOS pool (it must exist): durable stores "
                 "reach it, misses here are read from it; empty: none");
  app.add_option("--ceph-conf", f.ceph_conf,
                 "the Ceph cluster's ceph.conf (default: librados' search)");
  app.add_option("--ceph-user", f.ceph_user, "the cephx client name (client.NAME)")
      ->capture_default_str();
  app.add_flag("--rados-write-behind", f.rados_write_behind,
               "acknowledge durable stores once on this node's SSD and send them to RADOS from a "
               "bounded backlog (default: the acknowledgement waits for RADOS)");
  app.add_option("--rados-backlog-bytes", f.rados_backlog_bytes,
                 "with --rados-write-behind: the backlog's bound (past it a store is written "
                 "through)")
      ->capture_default_str();
  app.add_option("--rados-op-timeout-seconds", f.rados_op_timeout_s,
                 "a RADOS operation that takes longer fails (an OSD stopped or gone)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rados-retry-after-seconds", f.rados_retry_after_s,
                 "after RADOS fails to answer, calls skip it for this long (misses stay misses, "
                 "write-through stores fail at once), then ask it again")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rados-sweep-seconds", f.rados_sweep_s,
                 "remove the pool's chunks past their TTL this often, whoever wrote them (one "
                 "node sweeping is enough for a fleet; 0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

// Where and to whom it answers: the address, TLS, tokens, shared memory, metrics, logs.
void AddServingFlags(CLI::App& app, Flags& f) {
  app.add_option("--listen", f.listen, "address to serve on (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--tls-cert", f.tls_cert, "PEM certificate chain: serve TLS");
  app.add_option("--tls-key", f.tls_key, "PEM private key for --tls-cert");
  app.add_option("--auth-tokens", f.auth_file,
                 "file of \"TOKEN TENANT\" lines; without it everyone is one tenant");
  app.add_option("--shm-socket", f.shm_socket,
                 "Unix socket handing a tenant's RAM arena to its co-located clients (default "
                 "DATA_DIR/kvcached.sock; \"off\" disables it)");
  app.add_option("--shm-tenants", f.shm_tenants,
                 "with --auth-tokens: NAME[=BYTES],... tenants that use shared memory; each gets "
                 "a RAM pool of its own, carved out of --ram-bytes (default: an equal share), "
                 "that only it maps");
  app.add_option("--admin-tenants", f.admin_tenants,
                 "with --auth-tokens: comma-separated tenants whose Stats show the daemon's "
                 "totals (others see their own chunks and hits only)");
  app.add_option("--metrics-listen", f.metrics_listen,
                 "serve Prometheus /metrics on HOST:PORT (port 0: any)");
  app.add_option("--log-level", f.log_level,
                 "structured log (JSON lines on stderr): debug (every call), info (failed calls, "
                 "start, stop), warn, error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->capture_default_str();
}

// What one tenant may hold and ask for (docs/security.md).
void AddTenantLimitFlags(CLI::App& app, Flags& f) {
  app.add_option("--max-namespaces-per-tenant", f.max_namespaces_per_tenant,
                 "namespaces one tenant may register (0: no limit)")
      ->capture_default_str();
  app.add_option("--max-name-bytes", f.max_name_bytes,
                 "longest model_id (and peer tenant name) a namespace may have, in bytes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-registry-bytes-per-tenant", f.max_registry_bytes_per_tenant,
                 "bytes of the namespace registry one tenant's entries may take (0: no limit)")
      ->capture_default_str();
  app.add_option("--default-pin-limit", f.default_pin_limit,
                 "with --auth-tokens: chunks a tenant may pin at once when its --tenant-quota "
                 "names no pins= (0: no per-tenant limit)")
      ->capture_default_str();
  app.add_option("--max-leases-per-tenant", f.max_leases_per_tenant,
                 "shared-memory leases (FetchRefs, FetchDeviceRefs) one tenant holds at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-calls-per-tenant", f.max_calls_per_tenant,
                 "calls one tenant may have in flight (streams count for their whole life)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lookup-keys-per-second", f.lookup_keys_per_second,
                 "what one tenant's Lookups may cost per second, in keys (request bytes / 16); "
                 "past it (and a quarter second's burst) a Lookup waits up to 1 s, then is "
                 "refused; 0: no limit (default: 500,000 per core)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--tenant-quota", f.tenant_quota,
                 "TENANT:ram=BYTES,ssd=BYTES,pins=N,rados=BYTES (repeatable; TENANT * = every "
                 "tenant not named): a guaranteed share of each tier — the named quotas must "
                 "fit the tiers together, a '*' tenant is admitted at its first namespace while "
                 "its quota fits; over its quota a tenant evicts its own chunks, and tier "
                 "pressure never evicts a tenant within its quota. rados= bounds its bytes in "
                 "the shared tier, fleet-wide: a durable store past it is refused");
}

// A cluster node: membership in etcd, repair, drain (docs/cluster.md).
void AddClusterFlags(CLI::App& app, Flags& f) {
  f.etcd_flags.AddTo(app);
  app.add_option("--cluster", f.cluster_url,
                 "join the cluster whose membership is in this etcd (etcd://H:P[,H:P…]); "
                 "docs/cluster.md");
  app.add_option("--advertise", f.advertise,
                 "with --cluster: the HOST:PORT other machines reach this node at (default: "
                 "the address it listens on)");
  app.add_option("--node-id", f.node_id,
                 "with --cluster: this node's id (default: the data folder's, else a new one)");
  app.add_option("--cluster-lease-seconds", f.lease_seconds,
                 "with --cluster: a node that stops answering etcd leaves after this long")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  app.add_option("--cluster-secret-file", f.cluster_secret_file,
                 "with --cluster: file holding the cluster credential the nodes' repair calls "
                 "carry (one line; never a tenant token). Needed for repair when --auth-tokens "
                 "is on");
  app.add_option("--replicas", f.replicas,
                 "with --cluster: copies of each chunk repair keeps (R; the clients' replicas)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--repair-grace-seconds", f.repair_grace_s,
                 "with --cluster: the membership unchanged this long before a repair pass (a "
                 "node only restarting comes back within it)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--repair-interval-seconds", f.repair_interval_s,
                 "with --cluster: a repair pass at least this often (0: only after changes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--repair-mbps", f.repair_mbps,
                 "with --cluster: repair's copy bandwidth, MB/s of payload (0: unbounded)")
      ->capture_default_str();
  app.add_flag("--repair-drop-extra", f.drop_extra_copies,
               "with --cluster: drop a copy of a chunk this node no longer owns once every owner "
               "holds one (default: keep it as an extra copy until eviction takes it)");
  app.add_option("--repair-shard-chunks", f.repair_shard_chunks,
                 "tests only: chunks a repair pass lists at a time")
      ->group("");  // hidden from --help
  app.add_flag("--drain", f.drain_on_term,
               "with --cluster: on SIGTERM, hand every chunk to its other owners before "
               "exiting (SIGUSR1, and kvctl drain, always do)");
  app.add_option("--tombstone-seconds", f.tombstone_seconds,
                 "with --cluster: how long a tenant's Delete is remembered, so that a node "
                 "away for less than this cannot bring the chunk back (docs/cluster.md)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

absl::Status Fatal(const std::string& message) { return absl::FailedPreconditionError(message); }

// The daemon: what it builds from its flags, in the order it builds them, and how it stops.
// Each step says why it failed (Main prints it and exits 1).
struct Daemon {
  Flags f;
  std::string etcd_endpoints;  // with --cluster
  cluster::EtcdSecurity etcd_security;
  uint64_t reference_chunk = 0;  // the reference model's 256-token chunk, in bytes
  Authenticator auth;
  std::string cluster_secret;
  std::optional<ShmAccess> shm;
  std::optional<TenantQuotas> quotas;
  std::unique_ptr<storage::ChunkStore> store;
  std::optional<cluster::NodeInfo> node;  // with --cluster
  std::unique_ptr<NamespaceRegistry> registry;
  std::unique_ptr<Tombstones> tombstones;
  std::unique_ptr<ServiceMetrics> metrics;
  int metrics_port = 0;
  ServiceOptions opt;
  bool repairs = false;  // a cluster node that can reach its peers (repair.h)
  std::unique_ptr<ClusterRepair> repair;
  std::unique_ptr<KvCacheService> service;
  std::optional<ClusterPeerService> peer_service;
  std::unique_ptr<ArenaSocketServer> arena_socket;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string host;
  std::unique_ptr<cluster::NodeRegistration> registration;
  std::atomic<bool> index_failed{false};
  std::thread index_watch;
  std::unique_ptr<SharedSweeper> sweeper;

  absl::Status CheckFlags();
  absl::Status PrepareFolderAndTenants();
  absl::StatusOr<storage::StoreOptions> StoreOptionsFor(storage::StoreSeams& drills);
  absl::Status AddDeviceAndSharedTiers(storage::StoreOptions& so);
  absl::Status OpenState();
  absl::Status BuildService();
  absl::Status Listen();
  void SayWhereItListens();
  absl::Status JoinCluster();
  absl::Status StartRepair();
  void StartBackgroundWork();
  int Stop(int sig);
};

// What needs no side effect: flags that go together, the cluster's address, the log level.
absl::Status Daemon::CheckFlags() {
  if (f.tls_cert.empty() != f.tls_key.empty()) return Fatal("--tls-cert and --tls-key go together");
  absl::StatusOr<cluster::EtcdSecurity> security = f.etcd_flags.Resolve();
  if (!security.ok()) return Fatal(std::string(security.status().message()));
  etcd_security = *std::move(security);
  if (!f.cluster_url.empty()) {
    absl::StatusOr<std::string> eps = cluster::ParseEtcdUrl(f.cluster_url);
    if (!eps.ok()) return Fatal(absl::StrCat("--cluster: ", eps.status().message()));
    etcd_endpoints = *eps;
  } else if (!f.advertise.empty() || !f.node_id.empty()) {
    return Fatal("--advertise and --node-id only mean something with --cluster");
  }
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(f.log_level, &level);  // checked by the flag parser
  SetLogLevel(level);
  return absl::OkStatus();
}

// The data folder made private; the chunk size; who the tenants are, what they may map and
// keep; the cluster credential.
absl::Status Daemon::PrepareFolderAndTenants() {
  umask(0077);
  absl::StatusOr<int> tightened = KeepDataPrivate(f.data_dir);
  if (!tightened.ok()) return Fatal(std::string(tightened.status().message()));
  if (*tightened > 0) {
    LogLine(LogLevel::kInfo, "data_dir_private")
        .Str("data_dir", f.data_dir)
        .Int("entries_tightened", *tightened)
        .Str("why", "files 0600, folders 0700: every tenant's KV is in them");
  }
  // The reference model's chunk is the typical one: a new folder's first size class, and
  // what the RAM and HBM tiers count a chunk as (docs/storage.md, "Size classes").
  KVC_ASSIGN_OR_RETURN(reference_chunk, ReferenceChunkBytes());
  if (f.max_chunk_bytes == 0) f.max_chunk_bytes = std::max<uint64_t>(8ull << 20, reference_chunk);
  if (!f.auth_file.empty()) {
    KVC_ASSIGN_OR_RETURN(auth, Authenticator::FromFile(f.auth_file));
  }
  if (!f.cluster_secret_file.empty()) {
    if (f.cluster_url.empty())
      return Fatal("--cluster-secret-file only means something with --cluster");
    absl::StatusOr<std::string> secret = ReadClusterSecret(f.cluster_secret_file);
    if (!secret.ok())
      return Fatal("--cluster-secret-file: " + std::string(secret.status().message()));
    cluster_secret = *std::move(secret);
    if (auth.enabled() && auth.TenantFor("Bearer " + cluster_secret).ok()) {
      return Fatal("--cluster-secret-file: the cluster credential is also a tenant's token in " +
                   f.auth_file + "; a tenant must never hold it");
    }
  }
  KVC_ASSIGN_OR_RETURN(shm, ShmAccess::Plan(f.shm_tenants, auth.enabled(), f.ram_bytes));
  KVC_ASSIGN_OR_RETURN(quotas, TenantQuotas::Parse(f.tenant_quota));
  // Every tenant has a pin limit: without one, a tenant with no quota could pin the tiers'
  // whole share for pins (docs/security.md). One tenant alone (no tokens) needs none.
  if (auth.enabled()) quotas->set_default_pins(f.default_pin_limit);
  if (!auth.enabled() && !f.shm_tenants.empty()) {
    LogLine(LogLevel::kInfo, "shm_tenants_ignored")
        .Str("why", "without --auth-tokens every caller is one tenant and maps its own arena");
  }
  return absl::OkStatus();
}

// The store's options: the tiers sized to the disk, how it loads and checks, a fault drill.
absl::StatusOr<storage::StoreOptions> Daemon::StoreOptionsFor(storage::StoreSeams& drills) {
  // Never lay out more slab than the disk holds (the background zero-fill would fill it).
  KVC_ASSIGN_OR_RETURN(storage::DiskSpace disk, storage::MeasureDiskSpace(f.data_dir));
  if (const uint64_t fits = storage::FitSsdBytes(f.ssd_bytes, disk); fits < f.ssd_bytes) {
    LogLine(LogLevel::kWarn, "ssd_sized_to_free_space")
        .Int("requested_bytes", static_cast<int64_t>(f.ssd_bytes))
        .Int("granted_bytes", static_cast<int64_t>(fits))
        .Int("free_bytes", static_cast<int64_t>(disk.free_bytes))
        .Int("slab_bytes", static_cast<int64_t>(disk.slab_bytes))
        .Int("reserved_bytes", static_cast<int64_t>(storage::ReservedBytes(disk)));
    std::fprintf(stderr, "kvcached: --ssd-bytes %llu does not fit on the disk; using %llu\n",
                 static_cast<unsigned long long>(f.ssd_bytes),
                 static_cast<unsigned long long>(fits));
    f.ssd_bytes = fits;
  }
  storage::StoreOptions so;
  so.data_dir = f.data_dir;
  so.max_chunk_bytes = f.max_chunk_bytes;
  so.first_class_chunk_bytes = std::min(reference_chunk, f.max_chunk_bytes);
  so.ram_bytes = shm->default_pool_bytes();
  so.ram_pool_bytes = shm->private_pool_bytes();
  so.ssd_bytes = f.ssd_bytes;
  so.max_pinned_share = f.max_pinned_share;
  // Slabs are zero-filled before first use (see docs/storage.md); do it ahead of the
  // writes so that a put rarely waits for a slab to be laid out.
  so.preallocate_ssd_background = true;
  so.prefault_ram = f.prefault_ram;
  so.load_index_in_background = f.load_index_in_background;
  so.ram_verify =
      f.ram_verify == "every-read" ? storage::RamVerify::kEveryRead : storage::RamVerify::kScrub;
  so.ram_scrub_bytes_per_s = f.ram_scrub_mbps * 1000 * 1000;
  if (f.inject_io_faults > 0) {
    drills.faults =
        std::make_shared<storage::FaultPlan>(static_cast<uint64_t>(getpid()) ^ time(nullptr));
    storage::FaultRates r;
    r.read_eio = r.write_eio = r.write_enospc = r.sync_eio = f.inject_io_faults;
    r.short_read = f.inject_io_faults;
    drills.faults->set_rates(r);
    LogLine(LogLevel::kWarn, "injecting_io_faults")
        .Str("rate", absl::StrCat("1 in ", f.inject_io_faults));
  }
  KVC_RETURN_IF_ERROR(AddDeviceAndSharedTiers(so));
  return so;
}

// The HBM tier (T0, inside the store) and the shared tier below SSD, where asked for and
// built in.
absl::Status Daemon::AddDeviceAndSharedTiers(storage::StoreOptions& so) {
  if (f.hbm_bytes > 0) {
#if KVC_WITH_CUDA
    absl::StatusOr<std::unique_ptr<storage::DeviceArena>> arena =
        cuda::MakeHbmArena(f.hbm_device, f.hbm_bytes);
    if (!arena.ok()) return Fatal(absl::StrCat("--hbm-bytes: ", arena.status().message()));
    so.hbm_arena = *std::move(arena);
    so.hbm_write_through = f.hbm_write_through;
#else
    return Fatal("--hbm-bytes: this kvcached was built without the CUDA backend (nvcc not found)");
#endif
  }
  if (!f.rados_pool.empty()) {
#if KVC_WITH_RADOS
    storage::RadosTierOptions ro;
    ro.pool = f.rados_pool;
    ro.conf_file = f.ceph_conf;
    ro.user = f.ceph_user;
    ro.op_timeout_s = f.rados_op_timeout_s;
    absl::StatusOr<std::unique_ptr<storage::RadosTier>> rados = storage::RadosTier::Connect(ro);
    if (!rados.ok()) return Fatal(absl::StrCat("--rados-pool: ", rados.status().message()));
    so.shared_tier = *std::move(rados);
    so.shared_write_behind = f.rados_write_behind;
    so.shared_backlog_bytes = f.rados_backlog_bytes;
    so.shared_retry_after_s = f.rados_retry_after_s;
#else
    return Fatal(
        "--rados-pool: this kvcached was built without librados (scripts/install-deps.sh)");
#endif
  }
  return absl::OkStatus();
}

// What it keeps on disk: the store, a cluster node's identity, the namespaces, the deletes.
absl::Status Daemon::OpenState() {
  storage::StoreSeams drills;  // a fault drill's, if asked for
  KVC_ASSIGN_OR_RETURN(storage::StoreOptions so, StoreOptionsFor(drills));
  KVC_ASSIGN_OR_RETURN(store, storage::ChunkStore::Open(std::move(so), drills));
  if (!etcd_endpoints.empty()) {
    KVC_ASSIGN_OR_RETURN(node, LoadNodeIdentity(f.data_dir, f.node_id));
  }
  KVC_ASSIGN_OR_RETURN(
      registry, NamespaceRegistry::Open(
                    f.data_dir,
                    RegistryLimits{f.max_namespaces_per_tenant, f.max_registry_bytes_per_tenant,
                                   f.max_name_bytes, f.max_chunk_bytes},
                    node ? NamespaceIds::kDerived : NamespaceIds::kSequential));
  // A cluster node remembers its tenants' deletes (tombstones.h); one node needs not.
  if (node) {
    Tombstones::Options to;
    to.keep_s = f.tombstone_seconds;
    KVC_ASSIGN_OR_RETURN(tombstones, Tombstones::Open(f.data_dir, to));
  }
  return absl::OkStatus();
}

// The metrics, the service over the store and, on a cluster node, the peers' calls.
absl::Status Daemon::BuildService() {
  metrics = std::make_unique<ServiceMetrics>(store.get());
  if (!f.metrics_listen.empty()) {
    KVC_ASSIGN_OR_RETURN(metrics_port, metrics->Serve(f.metrics_listen));
  }
  opt.device_tenants = shm->tenants();
  opt.shm = *shm;
  KVC_RETURN_IF_ERROR(quotas->CheckNamedFit(store->QuotaCapacity()));
  opt.quotas = *std::move(quotas);
  opt.admin_tenants = absl::StrSplit(f.admin_tenants, ',', absl::SkipEmpty());
  opt.max_ref_leases = f.max_leases_per_tenant;
  opt.metrics = metrics.get();
  opt.max_chunk_bytes = f.max_chunk_bytes;
  opt.max_name_bytes = f.max_name_bytes;
  opt.tombstones = tombstones.get();
  opt.executor_threads = f.threads;
  opt.max_calls_per_tenant = f.max_calls_per_tenant;
  opt.lookup_keys_per_second = f.lookup_keys_per_second;
  opt.cluster = node.has_value();
  opt.durable_store_batch = f.durable_store_batch;
  opt.durable_store_in_flight = f.durable_store_in_flight;
  // A cluster node's repair (repair.h) starts once the node is registered (StartRepair);
  // its state goes into Stats for the tenants that see the daemon's totals. It needs the
  // credential to reach the other nodes when they have tenants (without tenants the peers'
  // calls are open: every namespace is "default"'s anyway).
  repairs = node && (!cluster_secret.empty() || !auth.enabled());
  if (repairs) {
    opt.repair_stats = [this](kvcache::v1::RepairStats* out) {
      if (repair) *out = repair->stats();
    };
    metrics->SetRepairSource(opt.repair_stats);
  }
  service = std::make_unique<KvCacheService>(store.get(), registry.get(), &auth, opt);
  // The peers' calls (peer_service.h): Drain raises SIGUSR1, which the signal loop (Main)
  // handles like SIGTERM with --drain.
  if (node) {
    storage::ChunkStore* chunks = store.get();
    peer_service.emplace(service.get(), cluster_secret,
                         [chunks, can = repairs]() -> absl::StatusOr<uint64_t> {
                           if (!can) {
                             return absl::FailedPreconditionError(
                                 "repair is off on this node (no --cluster-secret-file): it "
                                 "cannot hand its chunks over");
                           }
                           const storage::StoreStats s = chunks->Stats();
                           kill(getpid(), SIGUSR1);
                           return s.ssd_chunks + s.ram_chunks;
                         });
  }
  return absl::OkStatus();
}

// gRPC on the address (TLS, health, reflection, the message and stream limits), and the
// shared arena's socket.
absl::Status Daemon::Listen() {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!f.tls_cert.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({ReadAll(f.tls_key), ReadAll(f.tls_cert)});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  // Server reflection, so generic tools (grpcurl, grpc_cli, evans) list and call our methods
  // without the .proto files. It reveals only the API's shape, which is public anyway; every
  // method still checks its tenant's token.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(f.listen, creds, &port);
  builder.RegisterService(service.get());
  if (peer_service) builder.RegisterService(&*peer_service);
  // Messages: a whole chunk plus its tokens, or a Lookup of max_lookup_tokens ids.
  const int max_message = static_cast<int>(
      std::max<uint64_t>(f.max_chunk_bytes + (1 << 20), opt.max_lookup_tokens * 5 + (1 << 20)));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // Room on one connection for more streams than a tenant may have calls: a call past the
  // tenant's limit then reaches the service and is refused at once, instead of waiting in
  // the client's transport for a free stream until its deadline.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONCURRENT_STREAMS,
      static_cast<int>(std::max<uint32_t>(256, f.max_calls_per_tenant + 64)));
  // Chunks are ~220 KiB: a 64 KiB initial HTTP/2 window would stall every message on
  // window updates. Start each stream with room for several chunks.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  // gRPC listens with SO_REUSEPORT by default: a second kvcached given the port of a running
  // one (same user) started, and the kernel then split new connections between two caches
  // with different data. One daemon per address: the second one fails to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (f.shm_socket != "off" && store->ram_pool_count() > 0) {
    storage::ChunkStore* chunks = store.get();
    arena_socket = std::make_unique<ArenaSocketServer>(
        &auth, [chunks, access = *shm](const std::string& tenant) -> absl::StatusOr<SharedArena> {
          KVC_ASSIGN_OR_RETURN(storage::RamPoolId pool, access.MappablePool(tenant, *chunks));
          return SharedArena{chunks->ram_arena_fd(pool), chunks->ram_arena_bytes(pool)};
        });
    if (f.shm_socket.empty()) f.shm_socket = f.data_dir + "/kvcached.sock";
    KVC_RETURN_IF_ERROR(arena_socket->Start(f.shm_socket));
  }
  server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fatal("cannot listen on " + f.listen +
                 " (is another process listening there? gRPC's log above says why)");
  }
  host = f.listen.substr(0, f.listen.rfind(':'));
  return absl::OkStatus();
}

// The lines on stdout a supervisor (and the tests) read: where it listens, with what.
void Daemon::SayWhereItListens() {
  const storage::StoreStats st = store->StatsNow();  // capacities: known before the load
  std::printf("kvcached: listening on %s:%d (data %s, ram %llu chunks, ssd %llu chunks, io %s%s)\n",
              host.c_str(), port, f.data_dir.c_str(),
              static_cast<unsigned long long>(st.ram_capacity_chunks),
              static_cast<unsigned long long>(st.ssd_capacity_chunks), st.io_backend,
              auth.enabled() ? ", auth on" : "");
  if (metrics_port > 0)
    std::printf("kvcached: metrics on %s:%d/metrics\n", host.c_str(), metrics_port);
  if (arena_socket) std::printf("kvcached: shared arena on %s\n", f.shm_socket.c_str());
  if (st.hbm_capacity_chunks > 0) {
    std::printf("kvcached: HBM tier on CUDA device %d (%llu chunks)\n", f.hbm_device,
                static_cast<unsigned long long>(st.hbm_capacity_chunks));
  }
}

// A cluster node registers in etcd under the address others reach it at.
absl::Status Daemon::JoinCluster() {
  node->address = f.advertise.empty() ? absl::StrCat(host, ":", port) : f.advertise;
  if (node->address.rfind("0.0.0.0:", 0) == 0 || node->address.rfind("[::]:", 0) == 0) {
    return Fatal(
        "--cluster: listening on every interface; say with --advertise which address "
        "other machines reach this node at");
  }
  node->ram_bytes = f.ram_bytes;
  node->ssd_bytes = f.ssd_bytes;
  node->hbm_bytes = f.hbm_bytes;
  cluster::NodeRegistration::Options ro;
  ro.endpoints = etcd_endpoints;
  ro.etcd = etcd_security;
  ro.node = *node;
  ro.lease_seconds = f.lease_seconds;
  ro.log = [](const std::string& event, const std::string& detail) {
    LogLine(event == "cluster_etcd_unreachable" || event == "cluster_register_failed"
                ? LogLevel::kWarn
                : LogLevel::kInfo,
            event)
        .Str("detail", detail);
  };
  absl::StatusOr<std::unique_ptr<cluster::NodeRegistration>> r =
      cluster::NodeRegistration::Start(std::move(ro));
  if (!r.ok()) return Fatal(absl::StrCat("--cluster: ", r.status().message()));
  registration = *std::move(r);
  std::printf("kvcached: node %s (generation %llu) in cluster %s as %s%s\n", node->id.c_str(),
              static_cast<unsigned long long>(node->generation), f.cluster_url.c_str(),
              node->address.c_str(), registration->registered() ? "" : " (etcd not reached yet)");
  return absl::OkStatus();
}

// A registered cluster node's anti-entropy, watching the membership (repair.h).
absl::Status Daemon::StartRepair() {
  absl::StatusOr<std::unique_ptr<cluster::MembershipView>> view =
      cluster::MembershipView::Open(etcd_endpoints, etcd_security);
  if (!view.ok()) {
    // etcd answered the registration a moment ago; without a view there is no repair.
    return Fatal(absl::StrCat("--cluster: reading the membership: ", view.status().message()));
  }
  RepairOptions rep;
  rep.self_id = node->id;
  rep.replicas = f.replicas;
  rep.grace_s = f.repair_grace_s;
  rep.interval_s = f.repair_interval_s;
  rep.bytes_per_s = f.repair_mbps * 1000 * 1000;
  rep.secret = cluster_secret;
  rep.drop_extra_copies = f.drop_extra_copies;
  rep.tombstones = tombstones.get();
  rep.shard_chunks = f.repair_shard_chunks;
  if (!f.tls_cert.empty()) rep.tls_roots_pem = ReadAll(f.tls_cert);  // the cluster's shared chain
  rep.log = [](const std::string& event, const std::string& detail) {
    LogLine(event == "repair_copy_failed" || event == "repair_ask_failed" ||
                    event == "repair_pass_incomplete"
                ? LogLevel::kWarn
                : LogLevel::kInfo,
            event)
        .Str("detail", detail);
  };
  repair = std::make_unique<ClusterRepair>(std::move(rep), store.get(), registry.get(),
                                           *std::move(view));
  return absl::OkStatus();
}

// The work that runs beside the calls: the index load's watch, the shared tier's sweep.
void Daemon::StartBackgroundWork() {
  // A background index load that fails leaves a store whose every call on chunks fails:
  // stop, as a failed synchronous open would have (exit 1, so a supervisor restarts it).
  if (f.load_index_in_background) {
    index_watch = std::thread([this] {
      if (absl::Status s = store->WaitForIndex(); !s.ok()) {
        LogLine(LogLevel::kError, "index_load_failed").Str("error", s.message());
        index_failed = true;
        kill(getpid(), SIGTERM);
      }
    });
  }
  if (!f.rados_pool.empty() && f.rados_sweep_s > 0) {
    sweeper = std::make_unique<SharedSweeper>(
        store.get(), std::chrono::milliseconds(static_cast<int64_t>(f.rados_sweep_s * 1000)));
  }
}

// After signal `sig`: hands the chunks over when leaving for good, stops serving, flushes,
// and exits (0, or 1 when the index load failed).
int Daemon::Stop(int sig) {
  sweeper.reset();
  std::printf("kvcached: signal %d: draining\n", sig);
  std::fflush(stdout);
  LogLine(LogLevel::kInfo, "drain").Int("signal", sig);
  if (repair && !index_failed && (sig == SIGUSR1 || (sig == SIGTERM && f.drain_on_term))) {
    // Leaving for good: new chunks go to the next node of their ranking from now on; every
    // chunk here goes to its other owners while this node still serves it (its copies stay
    // readable meanwhile); then leave, and hand over anything that arrived in between.
    service->StopTakingStores();
    absl::Status handed = repair->Drain();
    LogLine(handed.ok() ? LogLevel::kInfo : LogLevel::kError, "drain_handed_over")
        .Str("status", handed.ToString());
    registration.reset();
    if (handed.ok()) handed = repair->Drain();
    std::printf("kvcached: chunks handed over%s\n",
                handed.ok() ? "" : (": " + handed.ToString()).c_str());
    std::fflush(stdout);
  }
  registration.reset();  // leave the cluster first: clients stop routing here at once
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  server->Wait();
  repair.reset();  // after the server: Stats reads it
  LogLine(LogLevel::kDebug, "server_stopped");
  service.reset();  // the executor finishes queued work; shared-memory leases end
  arena_socket.reset();
  LogLine(LogLevel::kDebug, "service_stopped");
  if (index_watch.joinable()) index_watch.join();  // the load has ended (or the store waits)
  if (absl::Status s = store->Flush(); !s.ok())
    LogLine(LogLevel::kError, "flush_failed").Str("error", s.message());
  store.reset();
  std::printf("kvcached: stopped\n");
  LogLine(LogLevel::kInfo, "stopped");
  // Everything is flushed and closed: leave now, without gRPC's library shutdown. In gRPC
  // 1.51 that shutdown joins an executor thread which may still sit in a poll bounded by
  // the server's shutdown deadline — a clean stop then took up to 10 s more to exit (seen
  // under load: the main thread in grpc_shutdown, joining "default-executor" in
  // epoll_wait), and a restart waited for nothing. The daemon's remaining parts are not
  // destroyed: anything that must reach disk or the network on a stop is reset above,
  // before "stopped" is printed.
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
  __lsan_do_leak_check();  // what a normal exit would have checked
#endif
  std::_Exit(index_failed ? 1 : 0);
}

// Builds the daemon step by step; the first step that fails says why (exit 1).
absl::Status Start(Daemon& d, const sigset_t& signals) {
  KVC_RETURN_IF_ERROR(d.CheckFlags());
  // Signals are handled by one thread in sigwait; block them before any thread starts.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  KVC_RETURN_IF_ERROR(d.PrepareFolderAndTenants());
  KVC_RETURN_IF_ERROR(d.OpenState());
  KVC_RETURN_IF_ERROR(d.BuildService());
  KVC_RETURN_IF_ERROR(d.Listen());
  d.SayWhereItListens();
  if (d.node) {
    KVC_RETURN_IF_ERROR(d.JoinCluster());
  }
  if (d.repairs) {
    KVC_RETURN_IF_ERROR(d.StartRepair());
  } else if (d.node) {
    std::printf(
        "kvcached: repair off: nodes with tenants need --cluster-secret-file to copy chunks to "
        "each other (docs/cluster.md)\n");
  }
  std::fflush(stdout);
  const storage::StoreStats st = d.store->StatsNow();
  LogLine(LogLevel::kInfo, "start")
      .Str("listen", absl::StrCat(d.host, ":", d.port))
      .Str("data_dir", d.f.data_dir)
      .Int("ram_chunks", static_cast<int64_t>(st.ram_capacity_chunks))
      .Int("ssd_chunks", static_cast<int64_t>(st.ssd_capacity_chunks))
      .Str("io", st.io_backend)
      .Str("auth", d.auth.enabled() ? "on" : "off")
      .Str("tls", d.f.tls_cert.empty() ? "off" : "on")
      .Int("hbm_chunks", static_cast<int64_t>(st.hbm_capacity_chunks));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"kvcached: tiered, persistent KV-cache service for DeepSeek V4.1 Flash prefixes"};
  auto d = std::make_unique<Daemon>();
  AddTierFlags(app, d->f);
  AddSharedTierFlags(app, d->f);
  AddServingFlags(app, d->f);
  AddTenantLimitFlags(app, d->f);
  AddClusterFlags(app, d->f);
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvcached")) return *stop;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // drain (kvctl drain sends the Drain call, which raises it)
  if (absl::Status s = Start(*d, signals); !s.ok()) return Fail(std::string(s.message()));
  d->StartBackgroundWork();
  int sig = 0;
  sigwait(&signals, &sig);
  return d.release()->Stop(sig);  // (exits; the daemon's parts are not destroyed, see Stop)
}

}  // namespace
}  // namespace kvc::cachesvc

int main(int argc, char** argv) {
  // Every Store message brings a chunk-sized buffer (gRPC's receive slices, the parsed
  // payload), by default a fresh mmap faulted in page by page (base/heap.h).
  kvc::KeepLargeBuffersInHeap(kvc::kDaemonHeap);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // Debian's absl is built with Mutex deadlock detection on (a release absl has it off):
  // every lock then updates a global lock graph, ~1 % of the daemon's CPU per stored chunk
  // (GraphCycles in `perf record`). The sanitizer builds the tests run keep it, and
  // scripts/lock-check.sh checks the lock order statically.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  return kvc::cachesvc::Main(argc, argv);
}
