#include "bench/kvbench/rados_bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "serve/local_ceph.h"
#include "storage/chunk_store.h"
#include "storage/rados_tier.h"
#include "storage/slot_format.h"

namespace kvc::bench {
namespace {

using Clock = std::chrono::steady_clock;
using storage::ChunkKey;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Runs a shell command; its standard output.
absl::StatusOr<std::string> Capture(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return absl::InternalError(absl::StrCat("cannot run ", cmd));
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p.get())) > 0;) out.append(buf.data(), n);
  const int rc = pclose(p.release());
  if (rc != 0) return absl::InternalError(absl::StrCat(cmd, " failed (status ", rc, ")"));
  return out;
}

// `rados bench ... --format json`: its summary's bandwidth (MiB/s) as MB/s (10^6 bytes).
absl::StatusOr<double> RadosBenchMbps(const std::string& out) {
  const size_t at = out.rfind("\n{");
  const nlohmann::json j =
      nlohmann::json::parse(at == std::string::npos ? out : out.substr(at + 1), nullptr, false);
  if (j.is_discarded() || !j.contains("bandwidth"))
    return absl::InternalError(
        absl::StrCat("rados bench printed no summary: ", out.substr(0, 400)));
  return std::stod(j["bandwidth"].get<std::string>()) * 1.048576;
}

ChunkKey KeyOf(uint64_t seed, uint64_t i) {
  ChunkKey k;
  std::mt19937_64 rng(seed * 1'000'003 + i);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunRadosBench(const RadosBenchOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::remove_all(o.dir, ec);
  fs::create_directories(o.dir);
  std::string conf = o.ceph_conf;
  std::unique_ptr<serve::LocalCeph> ceph;  // ended with the run, however it ends
  if (conf.empty()) {
    KVC_ASSIGN_OR_RETURN(ceph, serve::LocalCeph::Start(o.source_dir, o.dir + "/ceph", o.pool,
                                                       /*osd_bytes=*/4ull << 30));
    conf = ceph->conf();
  }
  storage::RadosTierOptions ro;
  ro.pool = o.pool;
  ro.conf_file = conf;
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::RadosTier> tier_owned,
                       storage::RadosTier::Connect(ro));
  std::shared_ptr<storage::RadosTier> tier = std::move(tier_owned);
  const std::string rados_cli = absl::StrCat("rados -c '", conf, "' -p '", o.pool, "' ");
  const uint64_t seed = std::random_device{}();
  std::vector<uint8_t> payload(o.chunk_bytes);
  std::mt19937_64 rng(seed);
  for (auto& b : payload) b = static_cast<uint8_t>(rng());
  constexpr storage::NamespaceId kNs = 1;

  // Both sides write the same number of objects (the memstore OSD slows as it fills).
  const uint64_t objects = std::max<uint64_t>(
      o.depth, o.max_bytes / std::max<uint64_t>(o.chunk_bytes, 1) / o.depth * o.depth);
  std::vector<double> peer_w, peer_r, ours_w, ours_r, store_r;
  nlohmann::json runs = nlohmann::json::array();
  for (int rep = 0; rep < o.reps; ++rep) {
    nlohmann::json run;
    auto peer = [&]() -> absl::Status {
      const std::string secs = absl::StrCat(static_cast<int>(std::max(1.0, o.seconds)));
      KVC_ASSIGN_OR_RETURN(std::string w,
                           Capture(absl::StrCat(rados_cli, "bench ", secs, " write -b ",
                                                o.chunk_bytes, " -t ", o.depth, " --max-objects ",
                                                objects, " --no-cleanup --format json 2>&1")));
      KVC_ASSIGN_OR_RETURN(double wm, RadosBenchMbps(w));
      KVC_ASSIGN_OR_RETURN(std::string r,
                           Capture(absl::StrCat(rados_cli, "bench ", secs, " seq -t ", o.depth,
                                                " --format json 2>&1")));
      KVC_ASSIGN_OR_RETURN(double rm, RadosBenchMbps(r));
      KVC_RETURN_IF_ERROR(Capture(rados_cli + "cleanup >/dev/null 2>&1").status());
      peer_w.push_back(wm);
      peer_r.push_back(rm);
      run["rados_bench_write_mbps"] = wm;
      run["rados_bench_read_mbps"] = rm;
      return absl::OkStatus();
    };
    auto ours = [&]() -> absl::Status {
      // Writes: as many chunks as rados bench writes, in batches of `depth` (a node's
      // durable puts).
      std::vector<ChunkKey> written;
      const auto t0 = Clock::now();
      while (Seconds(t0) < o.seconds && written.size() < objects) {
        std::vector<storage::SharedPut> puts;
        for (int i = 0; i < o.depth; ++i) {
          storage::SharedChunk meta;
          meta.namespace_tag = kNs;
          puts.push_back({KeyOf(seed + rep, written.size() + i), meta, payload});
        }
        for (const absl::Status& s : tier->PutMany(puts)) KVC_RETURN_IF_ERROR(s);
        for (const auto& p : puts) written.push_back(p.key);
      }
      const double ws = Seconds(t0);
      // Reads: each once, in batches of `depth`, verified.
      std::vector<std::vector<uint8_t>> bufs(o.depth, std::vector<uint8_t>(o.chunk_bytes));
      std::vector<std::span<uint8_t>> outs(bufs.begin(), bufs.end());
      const auto t1 = Clock::now();
      for (size_t at = 0; at < written.size(); at += o.depth) {
        const size_t n = std::min<size_t>(o.depth, written.size() - at);
        const std::vector<absl::Status> got = tier->GetMany(kNs, std::span(written).subspan(at, n),
                                                            std::span(outs).first(n), nullptr);
        for (const absl::Status& s : got) KVC_RETURN_IF_ERROR(s);
      }
      const double rs = Seconds(t1);
      // A node that lost its disk: a store on an empty folder reads them through its
      // shared tier (verified, promoted into RAM).
      storage::StoreOptions so;
      so.data_dir = absl::StrCat(o.dir, "/node", rep);
      so.max_chunk_bytes = o.chunk_bytes;
      so.ram_bytes = std::max<uint64_t>(o.max_bytes + (64ull << 20), 256ull << 20);
      so.ssd_bytes = 2 * o.max_bytes;
      so.prefault_ram = true;  // a running node's arena is faulted in at its start
      so.shared_tier = tier;
      KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkStore> node,
                           storage::ChunkStore::Open(so));
      KVC_RETURN_IF_ERROR(node->RegisterNamespace(kNs, o.chunk_bytes));
      const auto t2 = Clock::now();
      for (size_t at = 0; at < written.size(); at += o.depth) {
        const size_t n = std::min<size_t>(o.depth, written.size() - at);
        const std::vector<absl::Status> got =
            node->GetBatch(kNs, std::span(written).subspan(at, n), std::span(outs).first(n));
        for (const absl::Status& s : got) KVC_RETURN_IF_ERROR(s);
      }
      const double ns = Seconds(t2);
      node.reset();
      fs::remove_all(so.data_dir, ec);
      // Durable puts through a store (SSD write and fdatasync): on its own, with the
      // acknowledgement waiting for RADOS (write-through), and with write-behind (the
      // acknowledgement, then the time until the backlog reached RADOS).
      for (const char* mode : {"local", "through", "behind"}) {
        storage::StoreOptions po = so;
        po.data_dir = absl::StrCat(o.dir, "/put-", mode, rep);
        po.shared_tier = std::string(mode) == "local" ? nullptr : tier;
        po.shared_write_behind = std::string(mode) == "behind";
        po.shared_backlog_bytes = 2 * o.max_bytes;
        KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkStore> s, storage::ChunkStore::Open(po));
        KVC_RETURN_IF_ERROR(s->RegisterNamespace(kNs, o.chunk_bytes));
        const auto tp = Clock::now();
        for (size_t at = 0; at < written.size(); at += o.depth) {
          std::vector<storage::PutRequest> reqs;
          for (size_t i = at; i < std::min<size_t>(written.size(), at + o.depth); ++i)
            reqs.emplace_back(kNs, KeyOf(seed + 1000 + rep, i), std::nullopt, payload);
          for (const auto& r : s->PutBatch(reqs, {})) KVC_RETURN_IF_ERROR(r.status());
        }
        const double acked = Seconds(tp);
        KVC_RETURN_IF_ERROR(s->DrainSharedTier(std::chrono::minutes(5)));
        const double drained = Seconds(tp);
        const double mb = static_cast<double>(written.size() * o.chunk_bytes) / 1e6;
        run[absl::StrCat("store_put_", mode, "_mbps")] = mb / acked;
        if (std::string(mode) == "behind") run["store_put_behind_in_rados_mbps"] = mb / drained;
        s.reset();
        fs::remove_all(po.data_dir, ec);
        std::vector<ChunkKey> put_keys;
        for (size_t i = 0; i < written.size(); ++i) put_keys.push_back(KeyOf(seed + 1000 + rep, i));
        for (size_t at = 0; at < put_keys.size(); at += 256) {
          (void)tier->RemoveMany(
              std::span(put_keys).subspan(at, std::min<size_t>(256, put_keys.size() - at)));
        }
      }
      for (size_t at = 0; at < written.size(); at += 256) {
        (void)tier->RemoveMany(
            std::span(written).subspan(at, std::min<size_t>(256, written.size() - at)));
      }
      const double bytes = static_cast<double>(written.size() * o.chunk_bytes);
      ours_w.push_back(bytes / ws / 1e6);
      ours_r.push_back(bytes / rs / 1e6);
      store_r.push_back(bytes / ns / 1e6);
      run["chunks"] = written.size();
      run["tier_write_mbps"] = ours_w.back();
      run["tier_read_mbps"] = ours_r.back();
      run["store_fetch_mbps"] = store_r.back();
      return absl::OkStatus();
    };
    // Alternated order, so neither side always runs on a warmer cluster.
    if (rep % 2 == 0) {
      KVC_RETURN_IF_ERROR(peer());
      KVC_RETURN_IF_ERROR(ours());
    } else {
      KVC_RETURN_IF_ERROR(ours());
      KVC_RETURN_IF_ERROR(peer());
    }
    runs.push_back(run);
  }
  nlohmann::json j;
  j["chunk_bytes"] = o.chunk_bytes;
  j["depth"] = o.depth;
  j["objects"] = objects;
  j["runs"] = runs;
  j["rados_bench_write_mbps"] = Median(peer_w);
  j["rados_bench_read_mbps"] = Median(peer_r);
  j["tier_write_mbps"] = Median(ours_w);
  j["tier_read_mbps"] = Median(ours_r);
  j["store_fetch_mbps"] = Median(store_r);
  for (const char* f : {"store_put_local_mbps", "store_put_through_mbps", "store_put_behind_mbps",
                        "store_put_behind_in_rados_mbps"}) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r[f].get<double>());
    j[f] = Median(v);
  }
  j["write_vs_rados_bench"] = Median(ours_w) / Median(peer_w);
  j["read_vs_rados_bench"] = Median(ours_r) / Median(peer_r);
  j["store_fetch_vs_rados_bench"] = Median(store_r) / Median(peer_r);
  return j;
}

std::string RadosBenchToText(const nlohmann::json& j) {
  return absl::StrFormat(
      "RADOS, %d-byte chunks, %d in flight, median of %d runs (MB/s):\n"
      "  write: rados bench %.0f | RadosTier batches %.0f (%.2fx)\n"
      "  read:  rados bench %.0f | RadosTier batches %.0f (%.2fx) | a store on an empty "
      "folder, verified and promoted %.0f (%.2fx)\n"
      "  durable puts through a store: SSD only %.0f | acknowledged after RADOS (write-through) "
      "%.0f | write-behind: acknowledged %.0f, in RADOS %.0f\n",
      j["chunk_bytes"].get<uint64_t>(), j["depth"].get<int>(), static_cast<int>(j["runs"].size()),
      j["rados_bench_write_mbps"].get<double>(), j["tier_write_mbps"].get<double>(),
      j["write_vs_rados_bench"].get<double>(), j["rados_bench_read_mbps"].get<double>(),
      j["tier_read_mbps"].get<double>(), j["read_vs_rados_bench"].get<double>(),
      j["store_fetch_mbps"].get<double>(), j["store_fetch_vs_rados_bench"].get<double>(),
      j["store_put_local_mbps"].get<double>(), j["store_put_through_mbps"].get<double>(),
      j["store_put_behind_mbps"].get<double>(), j["store_put_behind_in_rados_mbps"].get<double>());
}

}  // namespace kvc::bench
