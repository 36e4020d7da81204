// kvbench: the project's benchmarks, each measured against a peer in the same run.
//
//   kvbench service [--dir DIR] [--seconds S] [--reps N] [--clients 1,8] [--chunks-per-call N]
//                   [--ops fetch,call,store] [--durable-stores] [--config FILE] [--json]
//   kvbench engine [--config FILE] [--weights FILE] [--prefill-tokens 512,2048,...]
//                  [--full-depth-max N] [--decode-tokens N] [--resume-prefix N]
//                  [--resume-new N] [--reps N] [--backend cpu|cuda|cublas] [--json]
//   kvbench e2e [--config FILE] [--prefix-tokens 4096,16384,65536] [--new-tokens N]
//               [--new-token-sweep 256,4096] [--hbm-bytes B] [--reps N] [--plot FILE.png] [--json]
//   kvbench cluster [--nodes 1,3] [--clients 1,4] [--seconds S] [--reps N] [--json]
//   kvbench trace --trace FILE [--config FILE] [--chunk-tokens C] [--limit N] [--speedup X]
//                 [--concurrency N] [--ram-bytes B] [--ssd-bytes B] [--json]
//   kvbench kernels [--config FILE] [--contexts 131072,1048576] [--batches 1,64]
//                   [--indexer-contexts ...] [--upload-mib N] [--reps N] [--json]   (GPU)
//   kvbench soak [--seconds S] [--clients N] [--kill-every S] [--io-fault-rate N] [--json]
//   kvbench fairness [--seconds S] [--flooders N] [--lookup-keys-per-second K] [--json]
//   kvbench restart [--chunks 20000,100000] [--chunk-bytes B] [--reps N] [--json]
//   kvbench footprint [--chunk-bytes 4096,16384,...] [--chunks N] [--config FILE]
//                     [--max-chunk-bytes N] [--json]
//   kvbench quality [--config FILE] [--weights NAME=FILE]... [--held-out FILE...]
//                   [--windows 0,32,64,128,256] [--documents N] [--points N]
//                   [--steps N] [--greedy-steps N] [--bootstrap N] [--seed S]
//                   [--decode-contexts 4096,16384,...] [--json]
//   kvbench storage --dir DIR [--seconds S] [--reps N] [--config FILE | --chunk-bytes N,...]
//                   [--dataset-chunks N | --dataset-bytes B] [--depths 1,8,32]
//                   [--ops fetch,store] [--no-fio]
//                   [--json]
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/heap.h"

#include "backends/program_flags.h"
#include "bench/kvbench/cluster_bench.h"
#include "bench/kvbench/e2e_bench.h"
#include "bench/kvbench/engine_bench.h"
#include "bench/kvbench/fairness_bench.h"
#include "bench/kvbench/footprint_bench.h"
#include "bench/kvbench/kernels_bench.h"
#include "bench/kvbench/quality_bench.h"
#include "bench/kvbench/report.h"
#include "bench/kvbench/restart_bench.h"
#if KVC_WITH_RADOS
#include "bench/kvbench/rados_bench.h"
#endif
#include "bench/kvbench/service_bench.h"
#include "bench/kvbench/soak.h"
#include "bench/kvbench/storage_bench.h"
#include "bench/kvbench/trace_bench.h"
#include "engine/spec/chunk_layout.h"
#include "programs/command_line.h"

namespace kvc {
namespace {

// The reference chunk's bytes of a model config (kDefaultChunkTokens tokens), or nullopt
// after saying why not and which flag gives the size instead.
std::optional<uint64_t> ChunkBytesOf(const std::string& config_path, const char* instead) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(config_path);
  absl::StatusOr<LayerSchedule> s =
      c.ok() ? BuildLayerSchedule(*c) : absl::StatusOr<LayerSchedule>(c.status());
  absl::StatusOr<ChunkLayout> l = s.ok() ? BuildChunkLayout(*c, *s, kDefaultChunkTokens)
                                         : absl::StatusOr<ChunkLayout>(s.status());
  if (!l.ok()) {
    std::cerr << "kvbench: error: " << l.status().message() << " (give --config FILE or " << instead
              << " N)\n";
    return std::nullopt;
  }
  return static_cast<uint64_t>(l->chunk_bytes);
}

// The text of the model config a case registers, or nullopt after saying why not.
std::optional<std::string> ReadModelConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "kvbench: error: cannot open model config \"" << path
              << "\" (give --config FILE)\n";
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The kvcached built beside this kvbench.
std::string SiblingKvcached() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kvcached").string();
}

using bench::PrintReport;

// One benchmark: its subcommand (flags bound to state the runner owns) and what runs it once
// the command line is parsed. Each Add* below declares one; --json is shared.
struct Case {
  CLI::App* command = nullptr;
  std::function<int()> run;
};

CLI::Option* PositiveOption(CLI::App* c, const std::string& name, auto& value,
                            const std::string& help) {
  return c->add_option(name, value, help)->check(CLI::PositiveNumber)->capture_default_str();
}

CLI::Option* ListOption(CLI::App* c, const std::string& name, auto& value,
                        const std::string& help) {
  return c->add_option(name, value, help)
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void AddJson(CLI::App* c, bool& json) { c->add_flag("--json", json, "print one JSON object"); }

struct StorageFlags {
  bench::StorageBenchOptions opt;
  std::string config = "configs/deepseek-v4.1-flash.config.json";
  std::vector<uint64_t> sizes;
  uint64_t dataset_bytes = 0;
  bool no_fio = false;
};

// Each size in turn, its peers beside it (one JSON object per size: an array for several).
int RunStorage(StorageFlags& f, bool json) {
  f.opt.run_fio = !f.no_fio;
  if (f.sizes.empty()) {
    std::optional<uint64_t> bytes = ChunkBytesOf(f.config, "--chunk-bytes");
    if (!bytes) return 1;
    f.sizes.push_back(*bytes);
  }
  bench::StorageBenchOptions& opt = f.opt;
  nlohmann::json all = nlohmann::json::array();
  const uint64_t dataset_chunks = opt.dataset_chunks;
  for (uint64_t size : f.sizes) {
    opt.chunk_bytes = size;
    opt.dataset_chunks =
        f.dataset_bytes > 0 ? std::max<uint64_t>(1, f.dataset_bytes / size) : dataset_chunks;
    absl::StatusOr<std::vector<bench::BenchCase>> cases = bench::RunStorageBench(opt);
    if (json && f.sizes.size() > 1) {
      if (!cases.ok()) return PrintReport(cases.status(), json, nullptr);
      all.push_back({{"chunk_bytes", size}, {"cases", bench::CasesToJson(*cases)}});
      continue;
    }
    const int rc = PrintReport(
        cases.ok() ? absl::StatusOr<nlohmann::json>(bench::CasesToJson(*cases)) : cases.status(),
        json, [&](const nlohmann::json&) {
          return absl::StrCat("chunk ", size, " B, ", opt.seconds, " s per run, ", opt.repetitions,
                              " alternated runs per case\n", bench::CasesToText(*cases));
        });
    if (rc != 0) return rc;
  }
  if (json && f.sizes.size() > 1) std::cout << all.dump(2) << "\n";
  return 0;
}

Case AddStorage(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "storage", "T1/T2 store and fetch vs fio, file-per-chunk, RocksDB blobs, memcpy");
  auto f = std::make_shared<StorageFlags>();
  c->add_option("--dir", f->opt.dir, "scratch folder on the disk under test (emptied afterwards)")
      ->required();
  PositiveOption(c, "--seconds", f->opt.seconds, "seconds per measured run");
  PositiveOption(c, "--reps", f->opt.repetitions, "alternated runs per case (median reported)");
  c->add_option("--config", f->config, "model config giving the chunk size")->capture_default_str();
  c->add_option("--chunk-bytes", f->sizes,
                "chunk sizes in bytes, each measured in turn (overrides --config)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  PositiveOption(c, "--dataset-chunks", f->opt.dataset_chunks, "chunks each system reads from");
  c->add_option("--dataset-bytes", f->dataset_bytes,
                "the data set in bytes instead (large enough to defeat the disk's caches)");
  ListOption(c, "--depths", f->opt.depths, "queue depths");
  c->add_option("--ops", f->opt.ops, "operations to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"fetch", "store"}))
      ->capture_default_str();
  c->add_flag("--no-fio", f->no_fio, "skip the fio peer");
  AddJson(c, json);
  return {c, [f, &json] { return RunStorage(*f, json); }};
}

struct ServiceFlags {
  bench::ServiceBenchOptions opt;
  std::string config = "configs/deepseek-v4.1-flash.config.json", kvcached_args;
  bool no_python = false;
};

int RunService(ServiceFlags& f, bool json) {
  std::optional<std::string> text = ReadModelConfig(f.config);
  if (!text) return 1;
  bench::ServiceBenchOptions& sopt = f.opt;
  sopt.model_config_json = *text;
  sopt.kvcached = SiblingKvcached();
  if (f.no_python) sopt.python_dir.clear();
  sopt.kvcached_args = absl::StrSplit(f.kvcached_args, ' ', absl::SkipEmpty());
  absl::StatusOr<std::vector<bench::ServiceCase>> cases = bench::RunServiceBench(sopt);
  return PrintReport(cases.ok() ? absl::StatusOr<nlohmann::json>(bench::ServiceCasesToJson(*cases))
                                : cases.status(),
                     json, [&](const nlohmann::json&) {
                       return absl::StrCat(sopt.seconds, " s per run, ", sopt.repetitions,
                                           " alternated runs per case\n",
                                           bench::ServiceCasesToText(*cases));
                     });
}

Case AddService(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand("service", "gRPC fetch and store through kvcached vs Redis");
  auto f = std::make_shared<ServiceFlags>();
  bench::ServiceBenchOptions& sopt = f->opt;
  sopt.dir = "/tmp/kvbench-service";
  c->add_option("--dir", sopt.dir, "scratch folder (emptied)")->capture_default_str();
  PositiveOption(c, "--seconds", sopt.seconds, "seconds per measured run");
  PositiveOption(c, "--reps", sopt.repetitions, "alternated runs per case");
  ListOption(c, "--clients", sopt.clients, "concurrent clients");
  c->add_option("--config", f->config, "model config giving the chunk size")->capture_default_str();
  c->add_option("--ops", sopt.ops, "operations to measure (stores run last)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fetch", "call", "store"}))
      ->capture_default_str();
  c->add_flag("--durable-stores", sopt.durable_stores,
              "stores durable: kvcached syncs them to its SSD tier, Redis to its "
              "append-only file before each reply (appendfsync always)");
  c->add_option("--kvcached-args", f->kvcached_args,
                "more kvcached options, space-separated (e.g. "
                "--kvcached-args='--durable-store-in-flight 1')");
  c->add_flag("!--no-shm-lease-cache", sopt.shm_lease_cache,
              "shared memory: a FetchRefs round trip on every fetch");
  PositiveOption(c, "--chunks-per-call", sopt.chunks_per_call,
                 "chunks per fetch or store call (a prefix)");
  sopt.python_dir = std::string(KVC_SOURCE_DIR) + "/python";
  sopt.python_fetch_script = std::string(KVC_SOURCE_DIR) + "/bench/kvbench/python_fetch.py";
  c->add_option("--python-dir", sopt.python_dir,
                "the kvcache Python package's folder (python-grpc, python-shm, sglang-grpc, "
                "sglang-shm, vllm-grpc systems)")
      ->capture_default_str();
  c->add_flag("--no-python", f->no_python, "skip the Python client's systems");
  AddJson(c, json);
  return {c, [f, &json] { return RunService(*f, json); }};
}

Case AddCluster(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "cluster", "prefix fetch, resume and store through the cluster client vs one node");
  auto copt = std::make_shared<bench::ClusterBenchOptions>();
  auto config = std::make_shared<std::string>("configs/deepseek-v4.1-flash.config.json");
  copt->dir = "/tmp/kvbench-cluster";
  c->add_option("--dir", copt->dir, "scratch folder (emptied)")->capture_default_str();
  c->add_option("--nodes", copt->nodes, "node counts (1: one kvcached, the peer)")
      ->delimiter(',')
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  ListOption(c, "--clients", copt->clients, "concurrent fetching clients");
  PositiveOption(c, "--seconds", copt->seconds, "seconds per measured run");
  PositiveOption(c, "--reps", copt->repetitions, "runs per case");
  PositiveOption(c, "--chunks-per-call", copt->chunks_per_call, "chunks per fetch (a prefix)");
  PositiveOption(c, "--resume-tokens", copt->resume_tokens, "tokens of the resumed prefix");
  c->add_option("--lookup-tokens", copt->lookup_tokens,
                "Lookup p50/p99 on a cached prefix this long (0: skip)")
      ->capture_default_str();
  c->add_option("--repair-chunks", copt->repair_chunks,
                "chunks stored on a fresh cluster of the largest node count before one of its "
                "nodes is lost, to time the repair (0: skip)")
      ->capture_default_str();
  c->add_option("--config", *config, "model config (the chunk size)")->capture_default_str();
  AddJson(c, json);
  return {c, [copt, config, &json] {
            std::optional<std::string> text = ReadModelConfig(*config);
            if (!text) return 1;
            copt->model_config_json = *text;
            copt->kvcached = SiblingKvcached();
            return PrintReport(bench::RunClusterBench(*copt), json, bench::ClusterBenchToText);
          }};
}

Case AddEngine(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "engine", "CPU engine: CED vs full-depth prefill, DSpark vs plain decode, resume vs cold");
  auto eopt = std::make_shared<bench::EngineBenchOptions>();
  eopt->config = "configs/mini.json";
  c->add_option("--config", eopt->config, "model config")->capture_default_str();
  c->add_option("--weights", eopt->weights, "safetensors (default: random, seed 1)");
  ListOption(c, "--prefill-tokens", eopt->prefill_tokens, "prompt lengths");
  c->add_option("--full-depth-max", eopt->full_depth_max,
                "longest prompt also prefilled at full depth")
      ->capture_default_str();
  PositiveOption(c, "--decode-tokens", eopt->decode_tokens, "tokens generated per decode run");
  PositiveOption(c, "--resume-prefix", eopt->resume_prefix, "cached tokens of the resume case");
  PositiveOption(c, "--resume-new", eopt->resume_new, "new tokens of the resume case");
  PositiveOption(c, "--reps", eopt->repetitions, "alternated runs per case");
  model::AddBackendFlag(*c, eopt->backend);
  c->add_option("--contexts", eopt->contexts,
                "only a context sweep: per length, prefill then --decode-tokens decoded")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  AddJson(c, json);
  return {c, [eopt, &json] {
            return PrintReport(bench::RunEngineBench(*eopt), json, bench::EngineBenchToText);
          }};
}

Case AddE2e(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "e2e", "TTFT resuming from kvcached (RAM, SSD) vs cold prefill, by prefix and new tokens");
  auto xopt = std::make_shared<bench::E2eBenchOptions>();
  c->add_option("--config", xopt->config, "model config")->capture_default_str();
  model::AddBackendFlag(*c, xopt->backend);
  c->add_option("--dir", xopt->dir, "scratch folder (emptied)")->capture_default_str();
  ListOption(c, "--prefix-tokens", xopt->prefix_tokens, "cached prefix lengths");
  PositiveOption(c, "--new-tokens", xopt->new_tokens, "new tokens of the prefix sweep");
  ListOption(c, "--new-token-sweep", xopt->new_token_sweep, "new-token counts at --sweep-prefix");
  PositiveOption(c, "--sweep-prefix", xopt->sweep_prefix, "cached prefix of the new-token sweep");
  c->add_option("--hbm-bytes", xopt->hbm_bytes,
                "give kvcached an HBM tier and resume from it too (a GPU backend)");
  PositiveOption(c, "--reps", xopt->repetitions, "alternated runs per case");
  c->add_flag("--rados", xopt->rados,
              "a single-host Ceph cluster as kvcached's shared tier; each prefix also resumed "
              "from RADOS after kvcached is killed and its folder deleted");
  c->add_option("--plot", xopt->plot, "write a PNG of TTFT vs prefix (needs gnuplot)");
  AddJson(c, json);
  return {c, [xopt, &json] {
            xopt->kvcached = SiblingKvcached();
            xopt->source_dir = KVC_SOURCE_DIR;
            return PrintReport(bench::RunE2eBench(*xopt), json, bench::E2eBenchToText);
          }};
}

Case AddTrace(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "trace", "a request trace replayed against kvcached, beside the simulator's hit rate");
  auto topt = std::make_shared<bench::TraceBenchOptions>();
  auto config = std::make_shared<std::string>("configs/deepseek-v4.1-flash.config.json");
  topt->dir = "/tmp/kvbench-trace";
  c->add_option("--trace", topt->trace, "Mooncake trace or agent-session JSON lines")->required();
  c->add_option("--config", *config, "model config (the chunk size)")->capture_default_str();
  c->add_option("--dir", topt->dir, "scratch folder (emptied)")->capture_default_str();
  PositiveOption(c, "--chunk-tokens", topt->chunk_tokens, "tokens per chunk");
  c->add_option("--limit", topt->limit, "the first N requests only")->check(CLI::NonNegativeNumber);
  c->add_option("--speedup", topt->speedup, "arrival times divided by X; 0: back to back")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  PositiveOption(c, "--concurrency", topt->concurrency, "requests in flight at once");
  c->add_option("--ram-bytes", topt->ram_bytes, "kvcached's RAM tier")->capture_default_str();
  c->add_option("--ssd-bytes", topt->ssd_bytes, "kvcached's SSD tier")->capture_default_str();
  AddJson(c, json);
  return {c, [topt, config, &json] {
            std::optional<std::string> text = ReadModelConfig(*config);
            if (!text) return 1;
            topt->model_config_json = *text;
            topt->kvcached = SiblingKvcached();
            return PrintReport(bench::RunTraceBench(*topt), json, bench::TraceBenchToText);
          }};
}

Case AddKernels(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "kernels",
      "GPU: attention and indexer vs copy bandwidth, page uploads vs pinned memcpy, "
      "GEMM vs cuBLAS");
  auto kopt = std::make_shared<bench::KernelBenchOptions>();
  kopt->config = "configs/deepseek-v4.1-flash.config.json";
  c->add_option("--config", kopt->config, "model config (shapes)")->capture_default_str();
  ListOption(c, "--contexts", kopt->contexts, "attention contexts (tokens)");
  ListOption(c, "--batches", kopt->batches, "decode batch sizes");
  ListOption(c, "--indexer-contexts", kopt->indexer_contexts, "indexer contexts (tokens)");
  PositiveOption(c, "--upload-mib", kopt->upload_mib, "host-to-device upload size");
  PositiveOption(c, "--reps", kopt->repetitions, "calls per timed round");
  AddJson(c, json);
  return {c, [kopt, &json] {
#if KVC_WITH_CUDA
            return PrintReport(bench::RunKernelBench(*kopt), json, bench::KernelBenchToText);
#else
            std::cerr << "kvbench: error: kernels needs the CUDA backend; this kvbench was built "
                         "without it (nvcc not found)\n";
            return 1;
#endif
          }};
}

Case AddSoak(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "soak", "kvcached under clients, SIGKILLs, SSD faults and a hostile tenant; nothing lost");
  auto o = std::make_shared<bench::SoakOptions>();
  auto config = std::make_shared<std::string>("configs/mini.json");
  o->dir = "/tmp/kvbench-soak";
  c->add_option("--dir", o->dir, "scratch folder (emptied)")->capture_default_str();
  PositiveOption(c, "--seconds", o->seconds, "how long the faults and clients run");
  c->add_option("--clients", o->clients, "concurrent clients of the first tenant")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  PositiveOption(c, "--kill-every", o->kill_every_s, "mean seconds between SIGKILLs of the daemon");
  PositiveOption(c, "--io-fault-rate", o->io_fault_rate,
                 "1 in N SSD operations fails (EIO, ENOSPC, short read)");
  c->add_option("--ssd-bytes", o->ssd_bytes, "the daemon's SSD tier (holds everything)")
      ->capture_default_str();
  c->add_option("--config", *config, "model config giving the chunk size")->capture_default_str();
  AddJson(c, json);
  return {c, [o, config, &json] {
            std::optional<std::string> text = ReadModelConfig(*config);
            if (!text) return 1;
            o->model_config_json = *text;
            o->kvcached = SiblingKvcached();
            absl::StatusOr<nlohmann::json> r = bench::RunSoak(*o);
            const int code = PrintReport(r, json, bench::SoakToText);
            return code != 0 ? code : (bench::SoakPassed(*r) ? 0 : 1);
          }};
}

Case AddFairness(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "fairness", "one tenant's small Lookups while another floods the daemon with large ones");
  auto o = std::make_shared<bench::FairnessOptions>();
  c->add_option("--dir", o->dir, "scratch folder (emptied)")->capture_default_str();
  c->add_option("--seconds", o->seconds, "each phase (alone, under the flood)")
      ->capture_default_str();
  c->add_option("--flooders", o->flooders, "threads of the flooding tenant")->capture_default_str();
  c->add_option("--lookup-keys-per-second", o->lookup_keys_per_second,
                "the paced daemon's rate per tenant (default: kvcached's)");
  AddJson(c, json);
  return {c, [o, &json] {
            o->kvcached = SiblingKvcached();
            return PrintReport(bench::RunFairnessBench(*o), json, bench::FairnessToText);
          }};
}

Case AddFootprint(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "footprint", "bytes each chunk size is charged per payload byte, RAM and SSD");
  auto o = std::make_shared<bench::FootprintOptions>();
  auto config = std::make_shared<std::string>("configs/deepseek-v4.1-flash.config.json");
  c->add_option("--dir", o->dir, "scratch folder (emptied)")->capture_default_str();
  ListOption(c, "--chunk-bytes", o->chunk_bytes, "chunk sizes");
  c->add_option("--mixed-budget-bytes", o->mixed_budget_bytes,
                "SSD budget of the mixed-size run (0: none)")
      ->capture_default_str();
  PositiveOption(c, "--chunks", o->chunks, "chunks stored per size");
  c->add_option("--config", *config,
                "model config whose chunk is the store's first size class (kvcached's)")
      ->capture_default_str();
  c->add_option("--max-chunk-bytes", o->max_chunk_bytes, "the store's largest chunk")
      ->capture_default_str();
  AddJson(c, json);
  return {c, [o, config, &json] {
            std::optional<uint64_t> bytes = ChunkBytesOf(*config, "--config");
            if (!bytes) return 1;
            o->first_class_chunk_bytes = *bytes;
            return PrintReport(bench::RunFootprintBench(*o), json, bench::FootprintToText);
          }};
}

#if KVC_WITH_RADOS
Case AddRados(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "rados", "the shared tier on Ceph RADOS: store and fetch beside `rados bench`, same run");
  auto o = std::make_shared<bench::RadosBenchOptions>();
  auto config = std::make_shared<std::string>(std::string(KVC_SOURCE_DIR) +
                                              "/configs/deepseek-v4.1-flash.config.json");
  c->add_option("--dir", o->dir, "scratch folder (emptied)")->capture_default_str();
  c->add_option("--ceph-conf", o->ceph_conf,
                "an existing cluster (default: a single-host one started in DIR/ceph)");
  c->add_option("--pool", o->pool, "pool (must exist with --ceph-conf)")->capture_default_str();
  c->add_option("--config", *config, "model config giving the chunk size");
  c->add_option("--chunk-bytes", o->chunk_bytes, "chunk size (instead of --config)");
  c->add_option("--depth", o->depth, "operations in flight")->capture_default_str();
  c->add_option("--seconds", o->seconds, "a write run's time limit")->capture_default_str();
  c->add_option("--bytes", o->max_bytes, "what each write run writes")->capture_default_str();
  c->add_option("--reps", o->reps, "alternated runs")->capture_default_str();
  AddJson(c, json);
  return {c, [o, config, &json] {
            if (o->chunk_bytes == 0) {
              std::optional<uint64_t> bytes = ChunkBytesOf(*config, "--chunk-bytes");
              if (!bytes) return 1;
              o->chunk_bytes = *bytes;
            }
            o->source_dir = KVC_SOURCE_DIR;
            return PrintReport(bench::RunRadosBench(*o), json, bench::RadosBenchToText);
          }};
}
#endif

Case AddRestart(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "restart", "kvcached holding N chunks on SSD, SIGKILLed: time to listening and first hit");
  auto o = std::make_shared<bench::RestartOptions>();
  c->add_option("--dir", o->dir, "scratch folder (emptied)")->capture_default_str();
  c->add_option("--chunks", o->chunks, "chunk counts, e.g. 20000,100000")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--chunk-bytes", o->chunk_bytes, "each chunk's payload")->capture_default_str();
  PositiveOption(c, "--reps", o->reps, "restarts per count");
  AddJson(c, json);
  return {c, [o, &json] {
            o->kvcached = SiblingKvcached();
            return PrintReport(bench::RunRestartBench(*o), json, bench::RestartToText);
          }};
}

struct QualityFlags {
  bench::QualityBenchOptions opt;
  std::vector<std::string> weights;  // NAME=FILE
};

int RunQuality(QualityFlags& f, bool json) {
  const std::string src = KVC_SOURCE_DIR;
  if (f.weights.empty()) {
    // The shipped twins of the config, named after it: configs/NAME.json's pair, trained on
    // corpus v2 (the default manifest's) from one trunk, is train/weights/NAME-v2-{plain,
    // replay} (small and small-deep ship one; docs/quality.md tables both).
    const std::string stem =
        src + "/train/weights/" + std::filesystem::path(f.opt.config).stem().string() + "-v2";
    for (const char* variant : {"plain", "replay"}) {
      const std::string file = stem + "-" + variant + ".safetensors";
      if (!std::filesystem::exists(file)) {
        std::cerr << "kvbench: error: no shipped weights for --config " << f.opt.config
                  << " (looked for " << file << "): give --weights NAME=FILE\n";
        return 2;
      }
    }
    f.weights = {"plain=" + stem + "-plain.safetensors",
                 "replay-aware=" + stem + "-replay.safetensors"};
  }
  for (const std::string& w : f.weights) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == w.size()) {
      std::cerr << "kvbench: error: --weights \"" << w << "\" is not NAME=FILE\n";
      return 2;
    }
    f.opt.variants.emplace_back(w.substr(0, eq), w.substr(eq + 1));
  }
  return PrintReport(bench::RunQualityBench(f.opt), json, bench::QualityBenchToText);
}

Case AddQuality(CLI::App& app, bool& json) {
  CLI::App* c = app.add_subcommand(
      "quality",
      "what a resume costs in answers: bounded/exact replay and CED vs full depth, "
      "DSpark, decode cost by component (a trained model, held-out text)");
  auto f = std::make_shared<QualityFlags>();
  bench::QualityBenchOptions& q = f->opt;
  const std::string src = KVC_SOURCE_DIR;
  q.config = src + "/configs/small.json";
  q.manifest = src + "/train/corpus-v2.json";
  c->add_option("--config", q.config, "model config")->capture_default_str();
  c->add_option("--weights", f->weights,
                "NAME=FILE, repeatable (default: the config's shipped twins, "
                "train/weights/CONFIG-v2-{plain,replay}.safetensors)");
  c->add_option("--manifest", q.manifest, "corpus manifest (its held-out split)")
      ->capture_default_str();
  c->add_option("--held-out", q.held_out, "text files instead of the held-out split");
  PositiveOption(c, "--documents", q.documents, "documents (the first by path, or --shuffle's)");
  c->add_option("--shuffle", q.shuffle,
                "non-zero: the documents are a sample drawn with this seed (0: the first by path)")
      ->capture_default_str();
  PositiveOption(c, "--points", q.points, "resume points per document");
  PositiveOption(c, "--chunk-tokens", q.chunk_tokens, "page size (resume points)");
  c->add_option("--new-tokens", q.new_tokens,
                "prompt tokens after the resume point (0: the window)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  PositiveOption(c, "--steps", q.steps, "tokens read teacher-forced per case");
  PositiveOption(c, "--greedy-steps", q.greedy_steps,
                 "tokens decoded greedily per case (identity, first divergence, KL over steps)");
  PositiveOption(c, "--bootstrap", q.bootstrap, "resamples of the documents per 95% interval");
  c->add_option("--seed", q.seed, "the resampling's seed")->capture_default_str();
  PositiveOption(c, "--max-prompt-tokens", q.max_prompt_tokens,
                 "resume points at most this far in (a full-depth prefill is quadratic)");
  c->add_option("--windows", q.windows, "bounded replay lengths")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--dspark-prompts", q.dspark_prompts, "prompts decoded with DSpark")
      ->capture_default_str();
  PositiveOption(c, "--dspark-steps", q.dspark_steps, "tokens per DSpark/plain decode");
  PositiveOption(c, "--dspark-probe-every", q.dspark_probe_every,
                 "DSpark on the documents' text: a speculative step every N tokens");
  PositiveOption(c, "--dspark-probes", q.dspark_probes, "DSpark probes per document");
  c->add_option("--decode-contexts", q.decode_contexts,
                "decode cost by component at these contexts (the last variant)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  PositiveOption(c, "--decode-tokens", q.decode_tokens, "tokens timed per context");
  PositiveOption(c, "--jobs", q.jobs,
                 "threads running the resume cases (the same figures for any count; DSpark "
                 "and decode timings run on one afterwards)");
  AddJson(c, json);
  return {c, [f, &json] { return RunQuality(*f, json); }};
}

int Main(int argc, char** argv) {
  CLI::App app{"kvbench: kvcache benchmarks, ours beside a peer in the same run"};
  app.require_subcommand(1);
  bool json = false;
  const std::vector<Case> cases = {
    AddStorage(app, json),
    AddService(app, json),
    AddCluster(app, json),
    AddEngine(app, json),
    AddE2e(app, json),
    AddTrace(app, json),
    AddKernels(app, json),
    AddSoak(app, json),
    AddFairness(app, json),
    AddFootprint(app, json),
#if KVC_WITH_RADOS
    AddRados(app, json),
#endif
    AddRestart(app, json),
    AddQuality(app, json)
  };
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvbench")) return *stop;
  for (const Case& c : cases) {
    if (c.command->parsed()) return c.run();
  }
  return 2;  // require_subcommand(1) makes this unreachable
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) {
  // Chunks fetched and stored pass through chunk-sized buffers: keep them warm (base/heap.h).
  kvc::KeepLargeBuffersInHeap(kvc::kClientHeap);
  return kvc::Main(argc, argv);
}
