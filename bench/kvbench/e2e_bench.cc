#include "bench/kvbench/e2e_bench.h"

#include "backends/select.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "client/client.h"
#include "engine/model/weights.h"
#include "serve/cache_connector.h"
#include "serve/kvcached_process.h"
#include "serve/local_ceph.h"

namespace kvc::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::vector<uint32_t> Prompt(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> t(n);
  for (uint32_t& v : t) v = static_cast<uint32_t>(rng() % vocab);
  return t;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunE2eBench(const E2eBenchOptions& o) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.config));
  std::ifstream cfg(o.config);
  std::stringstream config_text;
  config_text << cfg.rdbuf();
  std::error_code ec;
  fs::remove_all(o.dir, ec);
  fs::create_directories(o.dir);
  const std::string weights = (fs::path(o.dir) / "weights.safetensors").string();
  KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(config));
  KVC_RETURN_IF_ERROR(model::WriteRandomWeights(config, schedule, 1, weights));
  model::ModelOptions options;
  KVC_RETURN_IF_ERROR(model::SelectBackends(o.backend, /*exact_replay=*/true, options));
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> loaded,
                       model::Model::Load(config, weights, std::move(options)));
  const model::Model& m = *loaded;

  std::vector<std::string> flags = {"--ram-bytes", std::to_string(1ull << 30), "--ssd-bytes",
                                    std::to_string(4ull << 30)};
  if (o.hbm_bytes > 0) flags.insert(flags.end(), {"--hbm-bytes", std::to_string(o.hbm_bytes)});
  std::unique_ptr<serve::LocalCeph> ceph;  // ended with the run, however it ends
  if (o.rados) {
    KVC_ASSIGN_OR_RETURN(ceph, serve::LocalCeph::Start(
                                   o.source_dir, (fs::path(o.dir) / "ceph").string(), "kvcache"));
    const std::vector<std::string> shared = ceph->KvcachedFlags();
    flags.insert(flags.end(), shared.begin(), shared.end());
  }
  model::HbmChunkReader hbm_reader;
  if (o.hbm_bytes > 0) {
    hbm_reader = model::MakeHbmChunkReader();
    if (!hbm_reader) return absl::FailedPreconditionError("--hbm-bytes needs a CUDA device");
  }
  serve::KvcachedProcess daemon(o.kvcached, (fs::path(o.dir) / "kvcached").string(), flags);
  KVC_RETURN_IF_ERROR(daemon.Start());
  serve::ConnectorOptions copt;
  copt.model_config_json = config_text.str();
  copt.model_id = "kvbench-e2e";
  copt.replay = model::ReplayMode::kBounded;
  // `from_hbm`: an engine that reads chunks in HBM out over CUDA IPC (else it fetches them).
  auto connect = [&](bool from_hbm = false) {
    copt.client.address = daemon.address();
    copt.client.shm_socket = daemon.shm_socket();
    copt.hbm_reader = from_hbm ? hbm_reader : nullptr;
    return serve::CacheConnector::Create(m, copt);
  };
  std::unique_ptr<serve::CacheConnector> cache = connect();
  if (!cache->connected()) return absl::UnavailableError(cache->connect_error());

  nlohmann::json cases = nlohmann::json::array();
  // One case: prefix P cached (stored first), P + n tokens asked; cold beside warm from
  // RAM, and (with `ssd`) beside warm from SSD after a kvcached restart.
  auto run_case = [&](int64_t prefix, int64_t fresh, bool ssd, uint64_t seed) -> absl::Status {
    const std::vector<uint32_t> prompt = Prompt(prefix + fresh, config.vocab_size, seed);
    {
      std::fprintf(stderr, "kvbench: e2e %lld + %lld: caching the prefix\n",
                   static_cast<long long>(prefix), static_cast<long long>(fresh));
      model::Sequence s = m.NewSequence();
      KVC_ASSIGN_OR_RETURN(std::vector<float> l,
                           m.Prefill(s, std::span(prompt).first(prefix), model::PrefillMode::kCed));
      cache->StoreNewChunks(s);
      cache->Drain();
    }
    std::vector<std::string> tiers = {"ram"};
    if (o.hbm_bytes > 0) tiers.push_back("hbm");
    if (ssd) tiers.push_back("ssd");
    if (ssd && o.rados) tiers.push_back("rados");
    for (const std::string& tier : tiers) {
      std::unique_ptr<serve::CacheConnector> hbm_cache;
      if (tier == "hbm") {  // a lease brings the prefix into HBM; the engine reads it there
        auto* client = dynamic_cast<client::CacheClient*>(cache->client());
        if (client == nullptr) return absl::InternalError("no direct client for the HBM tier");
        KVC_ASSIGN_OR_RETURN(
            client::DeviceRefs refs,
            client->FetchDeviceRefs(*cache->ns(), client->Keys(*cache->ns(), prompt)));
        KVC_RETURN_IF_ERROR(client->ReleaseDeviceRefs(refs.lease_id));
        hbm_cache = connect(/*from_hbm=*/true);
      }
      if (tier == "ssd") {
        cache.reset();
        daemon.Stop(SIGTERM);
        KVC_RETURN_IF_ERROR(daemon.Start());
        cache = connect();
        if (!cache->connected()) return absl::UnavailableError(cache->connect_error());
      }
      if (tier == "rados") {  // the node and its disk are lost; it starts empty
        cache.reset();
        daemon.Stop(SIGKILL);
        fs::remove_all(fs::path(o.dir) / "kvcached", ec);
        KVC_RETURN_IF_ERROR(daemon.Start());
        cache = connect();
        if (!cache->connected()) return absl::UnavailableError(cache->connect_error());
      }
      // After a restart for SSD or RADOS: `cache` is a new connector.
      serve::CacheConnector& via = hbm_cache ? *hbm_cache : *cache;
      std::vector<double> cold, warm;
      serve::TurnReport report;
      for (int r = 0; r < o.repetitions; ++r) {
        std::fprintf(stderr, "kvbench: e2e %lld + %lld from %s run %d\n",
                     static_cast<long long>(prefix), static_cast<long long>(fresh), tier.c_str(),
                     r + 1);
        // Warm first on the SSD case: a fetch promotes the chunks to RAM.
        model::Sequence w = m.NewSequence();
        if (absl::StatusOr<std::vector<float>> l = via.Prefill(w, prompt, &report); !l.ok())
          return l.status();
        if (!report.warnings.empty()) return absl::InternalError(report.warnings[0]);
        if (tier == "hbm" && report.hbm_chunks * m.layout().chunk_tokens != report.reused_tokens) {
          return absl::InternalError(absl::StrCat("the resume read ", report.hbm_chunks,
                                                  " chunks out of HBM, not all it reused"));
        }
        warm.push_back(report.ttft_ms);
        model::Sequence c = m.NewSequence();
        const auto t = Clock::now();
        if (absl::StatusOr<std::vector<float>> l = m.Prefill(c, prompt, model::PrefillMode::kCed);
            !l.ok())
          return l.status();
        cold.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
        if (tier == "ssd" || tier == "rados") break;  // later runs would read RAM
        if (prefix >= 32768 && r == 0) break;
      }
      cases.push_back(
          {{"prefix_tokens", prefix},
           {"new_tokens", fresh},
           {"tier", report.tier},
           {"reused_tokens", report.reused_tokens},
           {"fetched_bytes", report.fetched_bytes},
           {"hbm_chunks", report.hbm_chunks},
           {"ttft_cold_ms", Median(cold)},
           {"ttft_warm_ms", Median(warm)},
           {"speedup", Median(cold) / Median(warm)},
           {"lookup_ms", report.lookup_ms},
           {"fetch_ms", report.fetch_ms},
           {"fetch_wait_ms", report.fetch_wait_ms},
           {"compute_ms", report.compute_ms},
           // What the request waited for: the lookup and the part of the fetch
           // not hidden behind the page-free layers.
           {"fetch_share", (report.lookup_ms + report.fetch_wait_ms) / report.ttft_ms}});
    }
    return absl::OkStatus();
  };
  uint64_t seed = 11;
  for (int64_t p : o.prefix_tokens) {
    KVC_RETURN_IF_ERROR(run_case(p, o.new_tokens, true, seed++));
  }
  for (int64_t n : o.new_token_sweep) {
    KVC_RETURN_IF_ERROR(run_case(o.sweep_prefix, n, false, seed++));
  }
  cache.reset();
  daemon.Stop(SIGTERM);
  fs::remove_all(o.dir, ec);
  nlohmann::json out = {{"config", o.config},
                        {"chunk_tokens", m.layout().chunk_tokens},
                        {"chunk_bytes", m.layout().chunk_bytes},
                        {"replay", "bounded"},
                        {"cases", cases}};
  if (!o.plot.empty()) out["plot"] = PlotE2e(out, o.plot);
  return out;
}

std::string E2eBenchToText(const nlohmann::json& r) {
  std::string s = absl::StrFormat("%8s %6s %-5s %11s %11s %8s %9s %9s %10s %11s\n", "prefix", "new",
                                  "tier", "cold ms", "warm ms", "speedup", "fetch ms", "waited ms",
                                  "wait share", "fetched");
  for (const auto& c : r["cases"]) {
    absl::StrAppendFormat(&s, "%8d %6d %-5s %11.0f %11.0f %7.1fx %9.1f %9.1f %9.1f%% %8.1f MB\n",
                          c["prefix_tokens"].get<int64_t>(), c["new_tokens"].get<int64_t>(),
                          c["tier"].get<std::string>(), c["ttft_cold_ms"].get<double>(),
                          c["ttft_warm_ms"].get<double>(), c["speedup"].get<double>(),
                          c["fetch_ms"].get<double>(), c["fetch_wait_ms"].get<double>(),
                          100 * c["fetch_share"].get<double>(),
                          c["fetched_bytes"].get<double>() / 1e6);
  }
  if (r.contains("plot")) absl::StrAppend(&s, "\nplot: ", r["plot"].get<std::string>(), "\n");
  return s;
}

std::string PlotE2e(const nlohmann::json& r, const std::string& png) {
  // TTFT against prefix length (the RAM and SSD rows of the prefix sweep), by gnuplot when
  // it is installed; the data file stays beside the PNG either way.
  const std::string dat = png + ".dat";
  {
    std::ofstream d(dat);
    d << "# prefix_tokens ttft_cold_ms ttft_warm_ram_ms ttft_warm_ssd_ms\n";
    std::map<int64_t, std::array<double, 3>> rows;
    for (const auto& c : r["cases"]) {
      if (c["new_tokens"] != r["cases"][0]["new_tokens"]) continue;
      auto& row = rows[c["prefix_tokens"].get<int64_t>()];
      row[0] = c["ttft_cold_ms"].get<double>();
      if (c["tier"] == "hbm" || c["tier"] == "rados") continue;  // the plot shows RAM and SSD
      row[c["tier"] == "ssd" ? 2 : 1] = c["ttft_warm_ms"].get<double>();
    }
    for (const auto& [p, v] : rows) d << p << " " << v[0] << " " << v[1] << " " << v[2] << "\n";
  }
  const std::string script = png + ".gp";
  {
    std::ofstream g(script);
    g << "set terminal png size 800,500\nset output '" << png << "'\n"
      << "set logscale xy\nset xlabel 'cached prefix (tokens), 1K new tokens'\n"
      << "set ylabel 'time to first token (ms)'\nset key top left\nset grid\n"
      << "set title 'kvcache: TTFT warm vs cold (mini model, CPU)'\n"
      << "plot '" << dat << "' using 1:2 with linespoints title 'cold prefill', '" << dat
      << "' using 1:3 with linespoints title 'warm, RAM tier', '" << dat
      << "' using 1:4 with linespoints title 'warm, SSD tier'\n";
  }
  const int rc = std::system(absl::StrCat("gnuplot '", script, "' 2>/dev/null").c_str());
  std::filesystem::remove(script);
  return rc == 0 ? png : absl::StrCat(dat, " (gnuplot not found: data only)");
}

}  // namespace kvc::bench
