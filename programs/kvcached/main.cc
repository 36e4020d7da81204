// kvcached: the kvcache daemon. Host-RAM and SSD tiers under a data folder, the
// kvcache.v1 gRPC service and the standard health service on one address.
//
//   kvcached [--data-dir DIR] [--listen HOST:PORT] [--ram-bytes N] [--ssd-bytes N]
//            [--auth-tokens FILE] [--max-chunk-bytes N] [--tls-cert F --tls-key F]
//            [--max-calls-per-tenant N] [--lookup-keys-per-second K] [--tenant-quota
//            TENANT:ram=B,ssd=B,pins=N …]
//            [--log-level debug|info|warn|error]
//            [--cluster etcd://H:P[,H:P…] [--advertise H:P] [--node-id NAME]]
//
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

int Main(int argc, char** argv) {
  CLI::App app{"kvcached: tiered, persistent KV-cache service for DeepSeek V4.1 Flash prefixes"};
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
  app.add_option("--data-dir", data_dir, "data folder (created if missing)")->capture_default_str();
  app.add_option("--listen", listen, "address to serve on (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--ram-bytes", ram_bytes, "host-RAM tier capacity")->capture_default_str();
  app.add_option("--ssd-bytes", ssd_bytes, "SSD tier capacity")->capture_default_str();
  app.add_option("--hbm-bytes", hbm_bytes,
                 "HBM tier (GPU memory, mapped by co-located engines over CUDA IPC); 0: none")
      ->capture_default_str();
  app.add_flag("--hbm-write-through", hbm_write_through,
               "stored chunks also go to the HBM tier at once (else on their first device fetch)");
  app.add_option("--hbm-device", hbm_device, "CUDA device of the HBM tier")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  // The shared tier (docs/rados.md).
  std::string rados_pool, ceph_conf, ceph_user = "admin";
  bool rados_write_behind = false;
  uint64_t rados_backlog_bytes = 256ull << 20;
  uint32_t rados_op_timeout_s = 5;
  double rados_retry_after_s = 5;
  double rados_sweep_s = 3600;
  app.add_option("--rados-pool", rados_pool,
                 "a shared tier below SSD on this Ceph RADOS pool (it must exist): durable stores "
                 "reach it, misses here are read from it; empty: none");
  app.add_option("--ceph-conf", ceph_conf,
                 "the Ceph cluster's ceph.conf (default: librados' search)");
  app.add_option("--ceph-user", ceph_user, "the cephx client name (client.NAME)")
      ->capture_default_str();
  app.add_flag("--rados-write-behind", rados_write_behind,
               "acknowledge durable stores once on this node's SSD and send them to RADOS from a "
               "bounded backlog (default: the acknowledgement waits for RADOS)");
  app.add_option("--rados-backlog-bytes", rados_backlog_bytes,
                 "with --rados-write-behind: the backlog's bound (past it a store is written "
                 "through)")
      ->capture_default_str();
  app.add_option("--rados-op-timeout-seconds", rados_op_timeout_s,
                 "a RADOS operation that takes longer fails (an OSD stopped or gone)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--rados-retry-after-seconds", rados_retry_after_s,
                 "after RADOS fails to answer, calls skip it for this long (misses stay misses, "
                 "write-through stores fail at once), then ask it again")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--rados-sweep-seconds", rados_sweep_s,
                 "remove the pool's chunks past their TTL this often, whoever wrote them (one "
                 "node sweeping is enough for a fleet; 0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--auth-tokens", auth_file,
                 "file of \"TOKEN TENANT\" lines; without it everyone is one tenant");
  app.add_option("--max-chunk-bytes", max_chunk_bytes,
                 "largest chunk any namespace may use (default: 8 MiB, or the reference model's "
                 "256-token chunk if larger); every size is stored in slots of its own size");
  app.add_option("--threads", threads, "storage worker threads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--shm-socket", shm_socket,
                 "Unix socket handing a tenant's RAM arena to its co-located clients (default "
                 "DATA_DIR/kvcached.sock; \"off\" disables it)");
  app.add_option("--shm-tenants", shm_tenants,
                 "with --auth-tokens: NAME[=BYTES],... tenants that use shared memory; each gets "
                 "a RAM pool of its own, carved out of --ram-bytes (default: an equal share), "
                 "that only it maps");
  app.add_option("--admin-tenants", admin_tenants,
                 "with --auth-tokens: comma-separated tenants whose Stats show the daemon's "
                 "totals (others see their own chunks and hits only)");
  app.add_option("--max-namespaces-per-tenant", max_namespaces_per_tenant,
                 "namespaces one tenant may register (0: no limit)")
      ->capture_default_str();
  app.add_option("--max-name-bytes", max_name_bytes,
                 "longest model_id (and peer tenant name) a namespace may have, in bytes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-registry-bytes-per-tenant", max_registry_bytes_per_tenant,
                 "bytes of the namespace registry one tenant's entries may take (0: no limit)")
      ->capture_default_str();
  app.add_option("--tombstone-seconds", tombstone_seconds,
                 "with --cluster: how long a tenant's Delete is remembered, so that a node "
                 "away for less than this cannot bring the chunk back (docs/cluster.md)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--default-pin-limit", default_pin_limit,
                 "with --auth-tokens: chunks a tenant may pin at once when its --tenant-quota "
                 "names no pins= (0: no per-tenant limit)")
      ->capture_default_str();
  app.add_option("--max-pinned-share", max_pinned_share,
                 "share of each tier's slots that pinned chunks may take, all tenants together")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--max-leases-per-tenant", max_leases_per_tenant,
                 "shared-memory leases (FetchRefs, FetchDeviceRefs) one tenant holds at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen,
                 "serve Prometheus /metrics on HOST:PORT (port 0: any)");
  app.add_option("--max-calls-per-tenant", max_calls_per_tenant,
                 "calls one tenant may have in flight (streams count for their whole life)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lookup-keys-per-second", lookup_keys_per_second,
                 "what one tenant's Lookups may cost per second, in keys (request bytes / 16); "
                 "past it (and a quarter second's burst) a Lookup waits up to 1 s, then is "
                 "refused; 0: no limit (default: 500,000 per core)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  etcd_flags.AddTo(app);
  app.add_option("--tenant-quota", tenant_quota,
                 "TENANT:ram=BYTES,ssd=BYTES,pins=N,rados=BYTES (repeatable; TENANT * = every "
                 "tenant not named): a guaranteed share of each tier — the named quotas must "
                 "fit the tiers together, a '*' tenant is admitted at its first namespace while "
                 "its quota fits; over its quota a tenant evicts its own chunks, and tier "
                 "pressure never evicts a tenant within its quota. rados= bounds its bytes in "
                 "the shared tier, fleet-wide: a durable store past it is refused");
  app.add_option("--log-level", log_level,
                 "structured log (JSON lines on stderr): debug (every call), info (failed calls, "
                 "start, stop), warn, error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--cluster", cluster_url,
                 "join the cluster whose membership is in this etcd (etcd://H:P[,H:P…]); "
                 "docs/cluster.md");
  app.add_option("--advertise", advertise,
                 "with --cluster: the HOST:PORT other machines reach this node at (default: "
                 "the address it listens on)");
  app.add_option("--node-id", node_id,
                 "with --cluster: this node's id (default: the data folder's, else a new one)");
  app.add_option("--cluster-lease-seconds", lease_seconds,
                 "with --cluster: a node that stops answering etcd leaves after this long")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  app.add_option("--cluster-secret-file", cluster_secret_file,
                 "with --cluster: file holding the cluster credential the nodes' repair calls "
                 "carry (one line; never a tenant token). Needed for repair when --auth-tokens "
                 "is on");
  app.add_option("--replicas", replicas,
                 "with --cluster: copies of each chunk repair keeps (R; the clients' replicas)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--repair-grace-seconds", repair_grace_s,
                 "with --cluster: the membership unchanged this long before a repair pass (a "
                 "node only restarting comes back within it)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--repair-interval-seconds", repair_interval_s,
                 "with --cluster: a repair pass at least this often (0: only after changes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--repair-mbps", repair_mbps,
                 "with --cluster: repair's copy bandwidth, MB/s of payload (0: unbounded)")
      ->capture_default_str();
  app.add_flag("--repair-drop-extra", drop_extra_copies,
               "with --cluster: drop a copy of a chunk this node no longer owns once every owner "
               "holds one (default: keep it as an extra copy until eviction takes it)");
  app.add_option("--durable-store-batch", durable_store_batch,
                 "durable chunks of one Store stream written and synced together (1: a sync per "
                 "chunk; the stream's answer always waits for all of them)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--durable-store-in-flight", durable_store_in_flight,
                 "batches of one Store stream written at once (2: the next batch is read and "
                 "written while the previous one's sync runs; 1: one batch at a time)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--repair-shard-chunks", repair_shard_chunks,
                 "tests only: chunks a repair pass lists at a time")
      ->group("");  // hidden from --help
  app.add_flag("--drain", drain_on_term,
               "with --cluster: on SIGTERM, hand every chunk to its other owners before "
               "exiting (SIGUSR1, and kvctl drain, always do)");
  bool load_index_in_background = true;
  app.add_flag("--load-index-in-background,!--no-load-index-in-background",
               load_index_in_background,
               "listen before the SSD index is in memory: lookups and fetches read the index "
               "on disk until it is, stores wait for it (a restart's first hit does not wait "
               "on the chunk count; the default. A load that fails stops the daemon, exit 1)");
  bool prefault_ram = true;
  app.add_flag("--prefault-ram,!--no-prefault-ram", prefault_ram,
               "fault the RAM tier's pages in at start, the default (its memory is taken at once; "
               "fills and promotions of SSD hits then pay no first-touch page faults)");
  std::string ram_verify = "scrub";
  app.add_option("--ram-verify", ram_verify,
                 "when RAM copies are checked against their checksums: scrub (on entering and "
                 "leaving RAM and by a background scrub, the default) or every-read (also on "
                 "every read; docs/storage.md)")
      ->check(CLI::IsMember({"scrub", "every-read"}))
      ->capture_default_str();
  uint64_t ram_scrub_mbps = 256;
  app.add_option("--ram-scrub-mbps", ram_scrub_mbps,
                 "the background scrub's rate over every RAM copy, MB/s (0: off)")
      ->capture_default_str();
  uint32_t inject_io_faults = 0;
  app.add_option("--inject-io-faults", inject_io_faults,
                 "soak tests only: about 1 in N SSD operations fails (EIO or ENOSPC on a read, "
                 "a write or a sync, or a short read); never corrupts bytes")
      ->group("");  // hidden from --help
  app.add_option("--tls-cert", tls_cert, "PEM certificate chain: serve TLS");
  app.add_option("--tls-key", tls_key, "PEM private key for --tls-cert");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvcached: error: " << e.what() << " (run kvcached --help)\n";
    return 2;
  }
  if (tls_cert.empty() != tls_key.empty()) return Fail("--tls-cert and --tls-key go together");
  std::string etcd_endpoints;
  absl::StatusOr<cluster::EtcdSecurity> etcd_security = etcd_flags.Resolve();
  if (!etcd_security.ok()) return Fail(std::string(etcd_security.status().message()));
  if (!cluster_url.empty()) {
    absl::StatusOr<std::string> eps = cluster::ParseEtcdUrl(cluster_url);
    if (!eps.ok()) return Fail(absl::StrCat("--cluster: ", eps.status().message()));
    etcd_endpoints = *eps;
  } else if (!advertise.empty() || !node_id.empty()) {
    return Fail("--advertise and --node-id only mean something with --cluster");
  }
  LogLevel level = LogLevel::kInfo;
  ParseLogLevel(log_level, &level);  // checked by the flag parser
  SetLogLevel(level);

  // Signals are handled by one thread in sigwait; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // drain (kvctl drain sends the Drain call, which raises it)
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  umask(0077);
  absl::StatusOr<int> tightened = KeepDataPrivate(data_dir);
  if (!tightened.ok()) return Fail(std::string(tightened.status().message()));
  if (*tightened > 0) {
    LogLine(LogLevel::kInfo, "data_dir_private")
        .Str("data_dir", data_dir)
        .Int("entries_tightened", *tightened)
        .Str("why", "files 0600, folders 0700: every tenant's KV is in them");
  }

  // The reference model's chunk is the typical one: a new folder's first size class, and
  // what the RAM and HBM tiers count a chunk as (docs/storage.md, "Size classes").
  absl::StatusOr<uint64_t> reference_chunk = ReferenceChunkBytes();
  if (!reference_chunk.ok()) return Fail(std::string(reference_chunk.status().message()));
  if (max_chunk_bytes == 0) max_chunk_bytes = std::max<uint64_t>(8ull << 20, *reference_chunk);
  Authenticator auth;
  if (!auth_file.empty()) {
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(auth_file);
    if (!a.ok()) return Fail(std::string(a.status().message()));
    auth = *std::move(a);
  }
  std::string cluster_secret;
  if (!cluster_secret_file.empty()) {
    if (cluster_url.empty())
      return Fail("--cluster-secret-file only means something with --cluster");
    absl::StatusOr<std::string> secret = ReadClusterSecret(cluster_secret_file);
    if (!secret.ok())
      return Fail("--cluster-secret-file: " + std::string(secret.status().message()));
    cluster_secret = *std::move(secret);
    if (auth.enabled() && auth.TenantFor("Bearer " + cluster_secret).ok()) {
      return Fail("--cluster-secret-file: the cluster credential is also a tenant's token in " +
                  auth_file + "; a tenant must never hold it");
    }
  }
  absl::StatusOr<ShmAccess> shm = ShmAccess::Plan(shm_tenants, auth.enabled(), ram_bytes);
  if (!shm.ok()) return Fail(std::string(shm.status().message()));
  absl::StatusOr<TenantQuotas> quotas = TenantQuotas::Parse(tenant_quota);
  if (!quotas.ok()) return Fail(std::string(quotas.status().message()));
  // Every tenant has a pin limit: without one, a tenant with no quota could pin the tiers'
  // whole share for pins (docs/security.md). One tenant alone (no tokens) needs none.
  if (auth.enabled()) quotas->set_default_pins(default_pin_limit);
  if (!auth.enabled() && !shm_tenants.empty()) {
    LogLine(LogLevel::kInfo, "shm_tenants_ignored")
        .Str("why", "without --auth-tokens every caller is one tenant and maps its own arena");
  }
  // Never lay out more slab than the disk holds (the background zero-fill would fill it).
  absl::StatusOr<storage::DiskSpace> disk = storage::MeasureDiskSpace(data_dir);
  if (!disk.ok()) return Fail(std::string(disk.status().message()));
  if (const uint64_t fits = storage::FitSsdBytes(ssd_bytes, *disk); fits < ssd_bytes) {
    LogLine(LogLevel::kWarn, "ssd_sized_to_free_space")
        .Int("requested_bytes", static_cast<int64_t>(ssd_bytes))
        .Int("granted_bytes", static_cast<int64_t>(fits))
        .Int("free_bytes", static_cast<int64_t>(disk->free_bytes))
        .Int("slab_bytes", static_cast<int64_t>(disk->slab_bytes))
        .Int("reserved_bytes", static_cast<int64_t>(storage::ReservedBytes(*disk)));
    std::fprintf(stderr, "kvcached: --ssd-bytes %llu does not fit on the disk; using %llu\n",
                 static_cast<unsigned long long>(ssd_bytes), static_cast<unsigned long long>(fits));
    ssd_bytes = fits;
  }
  storage::StoreOptions so;
  so.data_dir = data_dir;
  so.max_chunk_bytes = max_chunk_bytes;
  so.first_class_chunk_bytes = std::min(*reference_chunk, max_chunk_bytes);
  so.ram_bytes = shm->default_pool_bytes();
  so.ram_pool_bytes = shm->private_pool_bytes();
  so.ssd_bytes = ssd_bytes;
  so.max_pinned_share = max_pinned_share;
  // Slabs are zero-filled before first use (see docs/storage.md); do it ahead of the
  // writes so that a put rarely waits for a slab to be laid out.
  so.preallocate_ssd_background = true;
  so.prefault_ram = prefault_ram;
  so.load_index_in_background = load_index_in_background;
  so.ram_verify =
      ram_verify == "every-read" ? storage::RamVerify::kEveryRead : storage::RamVerify::kScrub;
  so.ram_scrub_bytes_per_s = ram_scrub_mbps * 1000 * 1000;
  storage::StoreSeams drills;  // a fault drill's, if asked for
  if (inject_io_faults > 0) {
    drills.faults =
        std::make_shared<storage::FaultPlan>(static_cast<uint64_t>(getpid()) ^ time(nullptr));
    storage::FaultRates r;
    r.read_eio = r.write_eio = r.write_enospc = r.sync_eio = inject_io_faults;
    r.short_read = inject_io_faults;
    drills.faults->set_rates(r);
    LogLine(LogLevel::kWarn, "injecting_io_faults")
        .Str("rate", absl::StrCat("1 in ", inject_io_faults));
  }
  if (hbm_bytes > 0) {  // T0, inside the store
#if KVC_WITH_CUDA
    absl::StatusOr<std::unique_ptr<storage::DeviceArena>> arena =
        cuda::MakeHbmArena(hbm_device, hbm_bytes);
    if (!arena.ok()) return Fail(absl::StrCat("--hbm-bytes: ", arena.status().message()));
    so.hbm_arena = *std::move(arena);
    so.hbm_write_through = hbm_write_through;
#else
    return Fail("--hbm-bytes: this kvcached was built without the CUDA backend (nvcc not found)");
#endif
  }
  if (!rados_pool.empty()) {
#if KVC_WITH_RADOS
    storage::RadosTierOptions ro;
    ro.pool = rados_pool;
    ro.conf_file = ceph_conf;
    ro.user = ceph_user;
    ro.op_timeout_s = rados_op_timeout_s;
    absl::StatusOr<std::unique_ptr<storage::RadosTier>> rados = storage::RadosTier::Connect(ro);
    if (!rados.ok()) return Fail(absl::StrCat("--rados-pool: ", rados.status().message()));
    so.shared_tier = *std::move(rados);
    so.shared_write_behind = rados_write_behind;
    so.shared_backlog_bytes = rados_backlog_bytes;
    so.shared_retry_after_s = rados_retry_after_s;
#else
    return Fail("--rados-pool: this kvcached was built without librados (scripts/install-deps.sh)");
#endif
  }
  absl::StatusOr<std::unique_ptr<storage::ChunkStore>> store =
      storage::ChunkStore::Open(so, drills);
  if (!store.ok()) return Fail(std::string(store.status().message()));
  std::optional<cluster::NodeInfo> node;
  if (!etcd_endpoints.empty()) {
    absl::StatusOr<cluster::NodeInfo> n = LoadNodeIdentity(data_dir, node_id);
    if (!n.ok()) return Fail(std::string(n.status().message()));
    node = *std::move(n);
  }
  absl::StatusOr<std::unique_ptr<NamespaceRegistry>> registry = NamespaceRegistry::Open(
      data_dir,
      RegistryLimits{max_namespaces_per_tenant, max_registry_bytes_per_tenant, max_name_bytes,
                     max_chunk_bytes},
      node ? NamespaceIds::kDerived : NamespaceIds::kSequential);
  if (!registry.ok()) return Fail(std::string(registry.status().message()));
  // A cluster node remembers its tenants' deletes (tombstones.h); one node needs not.
  std::unique_ptr<Tombstones> tombstones;
  if (node) {
    Tombstones::Options to;
    to.keep_s = tombstone_seconds;
    absl::StatusOr<std::unique_ptr<Tombstones>> t = Tombstones::Open(data_dir, to);
    if (!t.ok()) return Fail(std::string(t.status().message()));
    tombstones = *std::move(t);
  }

  ServiceMetrics metrics(store->get());
  int metrics_port = 0;
  if (!metrics_listen.empty()) {
    absl::StatusOr<int> p = metrics.Serve(metrics_listen);
    if (!p.ok()) return Fail(std::string(p.status().message()));
    metrics_port = *p;
  }
  ServiceOptions opt;
  opt.device_tenants = shm->tenants();
  opt.shm = *shm;
  if (absl::Status s = quotas->CheckNamedFit((*store)->QuotaCapacity()); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  opt.quotas = *std::move(quotas);
  opt.admin_tenants = absl::StrSplit(admin_tenants, ',', absl::SkipEmpty());
  opt.max_ref_leases = max_leases_per_tenant;
  opt.metrics = &metrics;
  opt.max_chunk_bytes = max_chunk_bytes;
  opt.max_name_bytes = max_name_bytes;
  opt.tombstones = tombstones.get();
  opt.executor_threads = threads;
  opt.max_calls_per_tenant = max_calls_per_tenant;
  opt.lookup_keys_per_second = lookup_keys_per_second;
  opt.cluster = node.has_value();
  opt.durable_store_batch = durable_store_batch;
  opt.durable_store_in_flight = durable_store_in_flight;
  // A cluster node's repair (repair.h): started once the node is registered (below); its
  // state goes into Stats for the tenants that see the daemon's totals.
  std::unique_ptr<ClusterRepair> repair;
  // Repair needs the credential to reach the other nodes when they have tenants (without
  // tenants the peers' calls are open: every namespace is "default"'s anyway).
  const bool repairs = node && (!cluster_secret.empty() || !auth.enabled());
  if (repairs) {
    opt.repair_stats = [&repair](kvcache::v1::RepairStats* out) {
      if (repair) *out = repair->stats();
    };
    metrics.SetRepairSource(opt.repair_stats);
  }
  auto service = std::make_unique<KvCacheService>(store->get(), registry->get(), &auth, opt);
  // The peers' calls (peer_service.h): Drain raises SIGUSR1, which the signal loop below
  // handles like SIGTERM with --drain.
  std::optional<ClusterPeerService> peer_service;
  if (node) {
    storage::ChunkStore* chunks = store->get();
    peer_service.emplace(service.get(), cluster_secret,
                         [chunks, repairs]() -> absl::StatusOr<uint64_t> {
                           if (!repairs) {
                             return absl::FailedPreconditionError(
                                 "repair is off on this node (no --cluster-secret-file): it "
                                 "cannot hand its chunks over");
                           }
                           const storage::StoreStats s = chunks->Stats();
                           kill(getpid(), SIGUSR1);
                           return s.ssd_chunks + s.ram_chunks;
                         });
  }

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!tls_cert.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({ReadAll(tls_key), ReadAll(tls_cert)});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  // Server reflection, so generic tools (grpcurl, grpc_cli, evans) list and call our methods
  // without the .proto files. It reveals only the API's shape, which is public anyway; every
  // method still checks its tenant's token.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, creds, &port);
  builder.RegisterService(service.get());
  if (peer_service) builder.RegisterService(&*peer_service);
  // Messages: a whole chunk plus its tokens, or a Lookup of max_lookup_tokens ids.
  const int max_message = static_cast<int>(
      std::max<uint64_t>(max_chunk_bytes + (1 << 20), opt.max_lookup_tokens * 5 + (1 << 20)));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // Room on one connection for more streams than a tenant may have calls: a call past the
  // tenant's limit then reaches the service and is refused at once, instead of waiting in
  // the client's transport for a free stream until its deadline.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(std::max<uint32_t>(256, max_calls_per_tenant + 64)));
  // Chunks are ~220 KiB: a 64 KiB initial HTTP/2 window would stall every message on
  // window updates. Start each stream with room for several chunks.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  std::unique_ptr<ArenaSocketServer> arena_socket;
  if (shm_socket != "off" && (*store)->ram_pool_count() > 0) {
    storage::ChunkStore* chunks = store->get();
    arena_socket = std::make_unique<ArenaSocketServer>(
        &auth, [chunks, access = *shm](const std::string& tenant) -> absl::StatusOr<SharedArena> {
          KVC_ASSIGN_OR_RETURN(storage::RamPoolId pool, access.MappablePool(tenant, *chunks));
          return SharedArena{chunks->ram_arena_fd(pool), chunks->ram_arena_bytes(pool)};
        });
    if (shm_socket.empty()) shm_socket = data_dir + "/kvcached.sock";
    if (absl::Status s = arena_socket->Start(shm_socket); !s.ok())
      return Fail(std::string(s.message()));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail("cannot listen on " + listen);
  const std::string host = listen.substr(0, listen.rfind(':'));
  const storage::StoreStats st = (*store)->StatsNow();  // capacities: known before the load
  std::printf("kvcached: listening on %s:%d (data %s, ram %llu chunks, ssd %llu chunks, io %s%s)\n",
              host.c_str(), port, data_dir.c_str(),
              static_cast<unsigned long long>(st.ram_capacity_chunks),
              static_cast<unsigned long long>(st.ssd_capacity_chunks), st.io_backend,
              auth.enabled() ? ", auth on" : "");
  if (metrics_port > 0)
    std::printf("kvcached: metrics on %s:%d/metrics\n", host.c_str(), metrics_port);
  if (arena_socket) std::printf("kvcached: shared arena on %s\n", shm_socket.c_str());
  if (st.hbm_capacity_chunks > 0) {
    std::printf("kvcached: HBM tier on CUDA device %d (%llu chunks)\n", hbm_device,
                static_cast<unsigned long long>(st.hbm_capacity_chunks));
  }
  std::unique_ptr<cluster::NodeRegistration> registration;
  if (node) {
    node->address = advertise.empty() ? absl::StrCat(host, ":", port) : advertise;
    if (node->address.rfind("0.0.0.0:", 0) == 0 || node->address.rfind("[::]:", 0) == 0) {
      return Fail(
          "--cluster: listening on every interface; say with --advertise which address "
          "other machines reach this node at");
    }
    node->ram_bytes = ram_bytes;
    node->ssd_bytes = ssd_bytes;
    node->hbm_bytes = hbm_bytes;
    cluster::NodeRegistration::Options ro;
    ro.endpoints = etcd_endpoints;
    ro.etcd = *etcd_security;
    ro.node = *node;
    ro.lease_seconds = lease_seconds;
    ro.log = [](const std::string& event, const std::string& detail) {
      LogLine(event == "cluster_etcd_unreachable" || event == "cluster_register_failed"
                  ? LogLevel::kWarn
                  : LogLevel::kInfo,
              event)
          .Str("detail", detail);
    };
    absl::StatusOr<std::unique_ptr<cluster::NodeRegistration>> r =
        cluster::NodeRegistration::Start(std::move(ro));
    if (!r.ok()) return Fail(absl::StrCat("--cluster: ", r.status().message()));
    registration = *std::move(r);
    std::printf("kvcached: node %s (generation %llu) in cluster %s as %s%s\n", node->id.c_str(),
                static_cast<unsigned long long>(node->generation), cluster_url.c_str(),
                node->address.c_str(), registration->registered() ? "" : " (etcd not reached yet)");
  }
  if (repairs) {
    absl::StatusOr<std::unique_ptr<cluster::MembershipView>> view =
        cluster::MembershipView::Open(etcd_endpoints, *etcd_security);
    if (!view.ok()) {
      // etcd answered the registration a moment ago; without a view there is no repair.
      return Fail(absl::StrCat("--cluster: reading the membership: ", view.status().message()));
    }
    RepairOptions rep;
    rep.self_id = node->id;
    rep.replicas = replicas;
    rep.grace_s = repair_grace_s;
    rep.interval_s = repair_interval_s;
    rep.bytes_per_s = repair_mbps * 1000 * 1000;
    rep.secret = cluster_secret;
    rep.drop_extra_copies = drop_extra_copies;
    rep.tombstones = tombstones.get();
    rep.shard_chunks = repair_shard_chunks;
    if (!tls_cert.empty()) rep.tls_roots_pem = ReadAll(tls_cert);  // the cluster's shared chain
    rep.log = [](const std::string& event, const std::string& detail) {
      LogLine(event == "repair_copy_failed" || event == "repair_ask_failed" ||
                      event == "repair_pass_incomplete"
                  ? LogLevel::kWarn
                  : LogLevel::kInfo,
              event)
          .Str("detail", detail);
    };
    repair = std::make_unique<ClusterRepair>(std::move(rep), store->get(), registry->get(),
                                             *std::move(view));
  } else if (node) {
    std::printf(
        "kvcached: repair off: nodes with tenants need --cluster-secret-file to copy chunks to "
        "each other (docs/cluster.md)\n");
  }
  std::fflush(stdout);
  LogLine(LogLevel::kInfo, "start")
      .Str("listen", absl::StrCat(host, ":", port))
      .Str("data_dir", data_dir)
      .Int("ram_chunks", static_cast<int64_t>(st.ram_capacity_chunks))
      .Int("ssd_chunks", static_cast<int64_t>(st.ssd_capacity_chunks))
      .Str("io", st.io_backend)
      .Str("auth", auth.enabled() ? "on" : "off")
      .Str("tls", tls_cert.empty() ? "off" : "on")
      .Int("hbm_chunks", static_cast<int64_t>(st.hbm_capacity_chunks));

  // A background index load that fails leaves a store whose every call on chunks fails:
  // stop, as a failed synchronous open would have (exit 1, so a supervisor restarts it).
  std::atomic<bool> index_failed{false};
  std::thread index_watch;
  if (load_index_in_background) {
    index_watch = std::thread([&] {
      if (absl::Status s = (*store)->WaitForIndex(); !s.ok()) {
        LogLine(LogLevel::kError, "index_load_failed").Str("error", s.message());
        index_failed = true;
        kill(getpid(), SIGTERM);
      }
    });
  }
  std::unique_ptr<SharedSweeper> sweeper;
  if (!rados_pool.empty() && rados_sweep_s > 0) {
    sweeper = std::make_unique<SharedSweeper>(
        store->get(), std::chrono::milliseconds(static_cast<int64_t>(rados_sweep_s * 1000)));
  }
  int sig = 0;
  sigwait(&signals, &sig);
  sweeper.reset();
  std::printf("kvcached: signal %d: draining\n", sig);
  std::fflush(stdout);
  LogLine(LogLevel::kInfo, "drain").Int("signal", sig);
  if (repair && !index_failed && (sig == SIGUSR1 || (sig == SIGTERM && drain_on_term))) {
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
  if (absl::Status s = (*store)->Flush(); !s.ok())
    LogLine(LogLevel::kError, "flush_failed").Str("error", s.message());
  store->reset();
  std::printf("kvcached: stopped\n");
  LogLine(LogLevel::kInfo, "stopped");
  // Everything is flushed and closed: leave now, without gRPC's library shutdown. In gRPC
  // 1.51 that shutdown joins an executor thread which may still sit in a poll bounded by
  // the server's shutdown deadline — a clean stop then took up to 10 s more to exit (seen
  // under load: the main thread in grpc_shutdown, joining "default-executor" in
  // epoll_wait), and a restart waited for nothing. Destructors of Main's remaining locals
  // do not run: anything that must reach disk or the network on a stop is reset above,
  // before "stopped" is printed.
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
  __lsan_do_leak_check();  // what a normal exit would have checked
#endif
  std::_Exit(index_failed ? 1 : 0);
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
