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
//                   [--decode-contexts 4096,16384,...] [--json]
//   kvbench storage --dir DIR [--seconds S] [--reps N] [--config FILE | --chunk-bytes N,...]
//                   [--dataset-chunks N | --dataset-bytes B] [--depths 1,8,32]
//                   [--ops fetch,store] [--no-fio]
//                   [--json]
#include <filesystem>
#include <fstream>
#include <iostream>
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

int Main(int argc, char** argv) {
  CLI::App app{"kvbench: kvcache benchmarks, ours beside a peer in the same run"};
  app.require_subcommand(1);
  CLI::App* storage = app.add_subcommand(
      "storage", "T1/T2 store and fetch vs fio, file-per-chunk, RocksDB blobs, memcpy");
  bench::StorageBenchOptions opt;
  std::string config = "configs/deepseek-v4.1-flash.config.json";
  bool json = false, no_fio = false;
  storage
      ->add_option("--dir", opt.dir, "scratch folder on the disk under test (emptied afterwards)")
      ->required();
  storage->add_option("--seconds", opt.seconds, "seconds per measured run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  storage->add_option("--reps", opt.repetitions, "alternated runs per case (median reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  storage->add_option("--config", config, "model config giving the chunk size")
      ->capture_default_str();
  std::vector<uint64_t> storage_sizes;
  storage
      ->add_option("--chunk-bytes", storage_sizes,
                   "chunk sizes in bytes, each measured in turn (overrides --config)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  storage->add_option("--dataset-chunks", opt.dataset_chunks, "chunks each system reads from")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  uint64_t dataset_bytes = 0;
  storage->add_option("--dataset-bytes", dataset_bytes,
                      "the data set in bytes instead (large enough to defeat the disk's caches)");
  storage->add_option("--depths", opt.depths, "queue depths")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  storage->add_option("--ops", opt.ops, "operations to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"fetch", "store"}))
      ->capture_default_str();
  storage->add_flag("--no-fio", no_fio, "skip the fio peer");
  storage->add_flag("--json", json, "print one JSON object");
  CLI::App* service =
      app.add_subcommand("service", "gRPC fetch and store through kvcached vs Redis");
  bench::ServiceBenchOptions sopt;
  sopt.dir = "/tmp/kvbench-service";
  service->add_option("--dir", sopt.dir, "scratch folder (emptied)")->capture_default_str();
  service->add_option("--seconds", sopt.seconds, "seconds per measured run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  service->add_option("--reps", sopt.repetitions, "alternated runs per case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  service->add_option("--clients", sopt.clients, "concurrent clients")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  service->add_option("--config", config, "model config giving the chunk size")
      ->capture_default_str();
  service->add_option("--ops", sopt.ops, "operations to measure (stores run last)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fetch", "call", "store"}))
      ->capture_default_str();
  service->add_flag("--durable-stores", sopt.durable_stores,
                    "stores durable: kvcached syncs them to its SSD tier, Redis to its "
                    "append-only file before each reply (appendfsync always)");
  std::string kvcached_args;
  service->add_option("--kvcached-args", kvcached_args,
                      "more kvcached options, space-separated (e.g. "
                      "--kvcached-args='--durable-store-in-flight 1')");
  service->add_flag("!--no-shm-lease-cache", sopt.shm_lease_cache,
                    "shared memory: a FetchRefs round trip on every fetch");
  service
      ->add_option("--chunks-per-call", sopt.chunks_per_call,
                   "chunks per fetch or store call (a prefix)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sopt.python_dir = std::string(KVC_SOURCE_DIR) + "/python";
  sopt.python_fetch_script = std::string(KVC_SOURCE_DIR) + "/bench/kvbench/python_fetch.py";
  service
      ->add_option("--python-dir", sopt.python_dir,
                   "the kvcache Python package's folder (python-grpc, python-shm, sglang-grpc, "
                   "sglang-shm, vllm-grpc systems)")
      ->capture_default_str();
  bool no_python = false;
  service->add_flag("--no-python", no_python, "skip the Python client's systems");
  service->add_flag("--json", json, "print one JSON object");
  CLI::App* cluster = app.add_subcommand(
      "cluster", "prefix fetch, resume and store through the cluster client vs one node");
  bench::ClusterBenchOptions copt;
  copt.dir = "/tmp/kvbench-cluster";
  std::string cluster_config = config;
  cluster->add_option("--dir", copt.dir, "scratch folder (emptied)")->capture_default_str();
  cluster->add_option("--nodes", copt.nodes, "node counts (1: one kvcached, the peer)")
      ->delimiter(',')
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cluster->add_option("--clients", copt.clients, "concurrent fetching clients")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cluster->add_option("--seconds", copt.seconds, "seconds per measured run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cluster->add_option("--reps", copt.repetitions, "runs per case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cluster->add_option("--chunks-per-call", copt.chunks_per_call, "chunks per fetch (a prefix)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cluster->add_option("--resume-tokens", copt.resume_tokens, "tokens of the resumed prefix")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cluster
      ->add_option("--lookup-tokens", copt.lookup_tokens,
                   "Lookup p50/p99 on a cached prefix this long (0: skip)")
      ->capture_default_str();
  cluster
      ->add_option("--repair-chunks", copt.repair_chunks,
                   "chunks stored on a fresh cluster of the largest node count before one of its "
                   "nodes is lost, to time the repair (0: skip)")
      ->capture_default_str();
  cluster->add_option("--config", cluster_config, "model config (the chunk size)")
      ->capture_default_str();
  cluster->add_flag("--json", json, "print one JSON object");
  CLI::App* engine = app.add_subcommand(
      "engine", "CPU engine: CED vs full-depth prefill, DSpark vs plain decode, resume vs cold");
  bench::EngineBenchOptions eopt;
  eopt.config = "configs/mini.json";
  engine->add_option("--config", eopt.config, "model config")->capture_default_str();
  engine->add_option("--weights", eopt.weights, "safetensors (default: random, seed 1)");
  engine->add_option("--prefill-tokens", eopt.prefill_tokens, "prompt lengths")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  engine
      ->add_option("--full-depth-max", eopt.full_depth_max,
                   "longest prompt also prefilled at full depth")
      ->capture_default_str();
  engine->add_option("--decode-tokens", eopt.decode_tokens, "tokens generated per decode run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  engine->add_option("--resume-prefix", eopt.resume_prefix, "cached tokens of the resume case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  engine->add_option("--resume-new", eopt.resume_new, "new tokens of the resume case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  engine->add_option("--reps", eopt.repetitions, "alternated runs per case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  model::AddBackendFlag(*engine, eopt.backend);
  engine
      ->add_option("--contexts", eopt.contexts,
                   "only a context sweep: per length, prefill then --decode-tokens decoded")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  engine->add_flag("--json", json, "print one JSON object");
  CLI::App* e2e = app.add_subcommand(
      "e2e", "TTFT resuming from kvcached (RAM, SSD) vs cold prefill, by prefix and new tokens");
  bench::E2eBenchOptions xopt;
  e2e->add_option("--config", xopt.config, "model config")->capture_default_str();
  model::AddBackendFlag(*e2e, xopt.backend);
  e2e->add_option("--dir", xopt.dir, "scratch folder (emptied)")->capture_default_str();
  e2e->add_option("--prefix-tokens", xopt.prefix_tokens, "cached prefix lengths")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  e2e->add_option("--new-tokens", xopt.new_tokens, "new tokens of the prefix sweep")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  e2e->add_option("--new-token-sweep", xopt.new_token_sweep, "new-token counts at --sweep-prefix")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  e2e->add_option("--sweep-prefix", xopt.sweep_prefix, "cached prefix of the new-token sweep")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  e2e->add_option("--hbm-bytes", xopt.hbm_bytes,
                  "give kvcached an HBM tier and resume from it too (a GPU backend)");
  e2e->add_option("--reps", xopt.repetitions, "alternated runs per case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  e2e->add_flag("--rados", xopt.rados,
                "a single-host Ceph cluster as kvcached's shared tier; each prefix also resumed "
                "from RADOS after kvcached is killed and its folder deleted");
  e2e->add_option("--plot", xopt.plot, "write a PNG of TTFT vs prefix (needs gnuplot)");
  e2e->add_flag("--json", json, "print one JSON object");
  CLI::App* trace = app.add_subcommand(
      "trace", "a request trace replayed against kvcached, beside the simulator's hit rate");
  bench::TraceBenchOptions topt;
  std::string trace_config = config;
  topt.dir = "/tmp/kvbench-trace";
  trace->add_option("--trace", topt.trace, "Mooncake trace or agent-session JSON lines")
      ->required();
  trace->add_option("--config", trace_config, "model config (the chunk size)")
      ->capture_default_str();
  trace->add_option("--dir", topt.dir, "scratch folder (emptied)")->capture_default_str();
  trace->add_option("--chunk-tokens", topt.chunk_tokens, "tokens per chunk")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  trace->add_option("--limit", topt.limit, "the first N requests only")
      ->check(CLI::NonNegativeNumber);
  trace->add_option("--speedup", topt.speedup, "arrival times divided by X; 0: back to back")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  trace->add_option("--concurrency", topt.concurrency, "requests in flight at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  trace->add_option("--ram-bytes", topt.ram_bytes, "kvcached's RAM tier")->capture_default_str();
  trace->add_option("--ssd-bytes", topt.ssd_bytes, "kvcached's SSD tier")->capture_default_str();
  trace->add_flag("--json", json, "print one JSON object");
  CLI::App* kernels = app.add_subcommand(
      "kernels",
      "GPU: attention and indexer vs copy bandwidth, page uploads vs pinned memcpy, "
      "GEMM vs cuBLAS");
  bench::KernelBenchOptions kopt;
  kopt.config = config;
  kernels->add_option("--config", kopt.config, "model config (shapes)")->capture_default_str();
  kernels->add_option("--contexts", kopt.contexts, "attention contexts (tokens)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kernels->add_option("--batches", kopt.batches, "decode batch sizes")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kernels->add_option("--indexer-contexts", kopt.indexer_contexts, "indexer contexts (tokens)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kernels->add_option("--upload-mib", kopt.upload_mib, "host-to-device upload size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kernels->add_option("--reps", kopt.repetitions, "calls per timed round")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  kernels->add_flag("--json", json, "print one JSON object");
  CLI::App* soak = app.add_subcommand(
      "soak", "kvcached under clients, SIGKILLs, SSD faults and a hostile tenant; nothing lost");
  bench::SoakOptions soak_opt;
  soak_opt.dir = "/tmp/kvbench-soak";
  std::string soak_config = "configs/mini.json";
  soak->add_option("--dir", soak_opt.dir, "scratch folder (emptied)")->capture_default_str();
  soak->add_option("--seconds", soak_opt.seconds, "how long the faults and clients run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  soak->add_option("--clients", soak_opt.clients, "concurrent clients of the first tenant")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  soak->add_option("--kill-every", soak_opt.kill_every_s,
                   "mean seconds between SIGKILLs of the daemon")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  soak->add_option("--io-fault-rate", soak_opt.io_fault_rate,
                   "1 in N SSD operations fails (EIO, ENOSPC, short read)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  soak->add_option("--ssd-bytes", soak_opt.ssd_bytes, "the daemon's SSD tier (holds everything)")
      ->capture_default_str();
  soak->add_option("--config", soak_config, "model config giving the chunk size")
      ->capture_default_str();
  soak->add_flag("--json", json, "print one JSON object");
  CLI::App* fairness = app.add_subcommand(
      "fairness", "one tenant's small Lookups while another floods the daemon with large ones");
  bench::FairnessOptions fair_opt;
  fairness->add_option("--dir", fair_opt.dir, "scratch folder (emptied)")->capture_default_str();
  fairness->add_option("--seconds", fair_opt.seconds, "each phase (alone, under the flood)")
      ->capture_default_str();
  fairness->add_option("--flooders", fair_opt.flooders, "threads of the flooding tenant")
      ->capture_default_str();
  fairness->add_option("--lookup-keys-per-second", fair_opt.lookup_keys_per_second,
                       "the paced daemon's rate per tenant (default: kvcached's)");
  fairness->add_flag("--json", json, "print one JSON object");
  CLI::App* footprint = app.add_subcommand(
      "footprint", "bytes each chunk size is charged per payload byte, RAM and SSD");
  bench::FootprintOptions footprint_opt;
  std::string footprint_config = "configs/deepseek-v4.1-flash.config.json";
  footprint->add_option("--dir", footprint_opt.dir, "scratch folder (emptied)")
      ->capture_default_str();
  footprint->add_option("--chunk-bytes", footprint_opt.chunk_bytes, "chunk sizes")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  footprint
      ->add_option("--mixed-budget-bytes", footprint_opt.mixed_budget_bytes,
                   "SSD budget of the mixed-size run (0: none)")
      ->capture_default_str();
  footprint->add_option("--chunks", footprint_opt.chunks, "chunks stored per size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  footprint
      ->add_option("--config", footprint_config,
                   "model config whose chunk is the store's first size class (kvcached's)")
      ->capture_default_str();
  footprint
      ->add_option("--max-chunk-bytes", footprint_opt.max_chunk_bytes, "the store's largest chunk")
      ->capture_default_str();
  footprint->add_flag("--json", json, "print one JSON object");
#if KVC_WITH_RADOS
  CLI::App* rados = app.add_subcommand(
      "rados", "the shared tier on Ceph RADOS: store and fetch beside `rados bench`, same run");
  bench::RadosBenchOptions rados_opt;
  std::string rados_config =
      std::string(KVC_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.config.json";
  rados->add_option("--dir", rados_opt.dir, "scratch folder (emptied)")->capture_default_str();
  rados->add_option("--ceph-conf", rados_opt.ceph_conf,
                    "an existing cluster (default: a single-host one started in DIR/ceph)");
  rados->add_option("--pool", rados_opt.pool, "pool (must exist with --ceph-conf)")
      ->capture_default_str();
  rados->add_option("--config", rados_config, "model config giving the chunk size");
  rados->add_option("--chunk-bytes", rados_opt.chunk_bytes, "chunk size (instead of --config)");
  rados->add_option("--depth", rados_opt.depth, "operations in flight")->capture_default_str();
  rados->add_option("--seconds", rados_opt.seconds, "a write run's time limit")
      ->capture_default_str();
  rados->add_option("--bytes", rados_opt.max_bytes, "what each write run writes")
      ->capture_default_str();
  rados->add_option("--reps", rados_opt.reps, "alternated runs")->capture_default_str();
  rados->add_flag("--json", json, "print one JSON object");
#endif
  CLI::App* restart = app.add_subcommand(
      "restart", "kvcached holding N chunks on SSD, SIGKILLed: time to listening and first hit");
  bench::RestartOptions restart_opt;
  restart->add_option("--dir", restart_opt.dir, "scratch folder (emptied)")->capture_default_str();
  restart->add_option("--chunks", restart_opt.chunks, "chunk counts, e.g. 20000,100000")
      ->delimiter(',')
      ->capture_default_str();
  restart->add_option("--chunk-bytes", restart_opt.chunk_bytes, "each chunk's payload")
      ->capture_default_str();
  restart->add_option("--reps", restart_opt.reps, "restarts per count")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  restart->add_flag("--json", json, "print one JSON object");
  CLI::App* quality = app.add_subcommand(
      "quality",
      "what a resume costs in answers: bounded/exact replay and CED vs full depth, "
      "DSpark, decode cost by component (a trained model, held-out text)");
  bench::QualityBenchOptions qopt;
  const std::string src = KVC_SOURCE_DIR;
  qopt.config = src + "/configs/small.json";
  qopt.manifest = src + "/train/corpus.json";
  std::vector<std::string> qweights;
  quality->add_option("--config", qopt.config, "model config")->capture_default_str();
  quality->add_option("--weights", qweights,
                      "NAME=FILE, repeatable (default: the shipped small-plain and small-replay)");
  quality->add_option("--manifest", qopt.manifest, "corpus manifest (its held-out split)")
      ->capture_default_str();
  quality->add_option("--held-out", qopt.held_out, "text files instead of the held-out split");
  quality->add_option("--documents", qopt.documents, "documents (the first by path)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  quality->add_option("--points", qopt.points, "resume points per document")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  quality->add_option("--chunk-tokens", qopt.chunk_tokens, "page size (resume points)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  quality
      ->add_option("--new-tokens", qopt.new_tokens,
                   "prompt tokens after the resume point (0: the window)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  quality->add_option("--steps", qopt.steps, "tokens decoded and read teacher-forced per case")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  quality
      ->add_option("--max-prompt-tokens", qopt.max_prompt_tokens,
                   "resume points at most this far in (a full-depth prefill is quadratic)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  quality->add_option("--windows", qopt.windows, "bounded replay lengths")
      ->delimiter(',')
      ->capture_default_str();
  quality->add_option("--dspark-prompts", qopt.dspark_prompts, "prompts decoded with DSpark")
      ->capture_default_str();
  quality->add_option("--dspark-steps", qopt.dspark_steps, "tokens per DSpark/plain decode")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  quality
      ->add_option("--decode-contexts", qopt.decode_contexts,
                   "decode cost by component at these contexts (the last variant)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  quality->add_option("--decode-tokens", qopt.decode_tokens, "tokens timed per context")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  quality->add_flag("--json", json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvbench: error: " << e.what() << " (run kvbench --help)\n";
    return 2;
  }
  if (kernels->parsed()) {
#if KVC_WITH_CUDA
    return PrintReport(bench::RunKernelBench(kopt), json, bench::KernelBenchToText);
#else
    std::cerr << "kvbench: error: kernels needs the CUDA backend; this kvbench was built "
                 "without it (nvcc not found)\n";
    return 1;
#endif
  }
  if (quality->parsed()) {
    if (qweights.empty()) {
      qweights = {"plain=" + src + "/train/weights/small-plain.safetensors",
                  "replay-aware=" + src + "/train/weights/small-replay.safetensors"};
    }
    for (const std::string& w : qweights) {
      const size_t eq = w.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == w.size()) {
        std::cerr << "kvbench: error: --weights \"" << w << "\" is not NAME=FILE\n";
        return 2;
      }
      qopt.variants.emplace_back(w.substr(0, eq), w.substr(eq + 1));
    }
    return PrintReport(bench::RunQualityBench(qopt), json, bench::QualityBenchToText);
  }
  if (footprint->parsed()) {
    std::optional<uint64_t> bytes = ChunkBytesOf(footprint_config, "--config");
    if (!bytes) return 1;
    footprint_opt.first_class_chunk_bytes = *bytes;
    return PrintReport(bench::RunFootprintBench(footprint_opt), json, bench::FootprintToText);
  }
#if KVC_WITH_RADOS
  if (rados->parsed()) {
    if (rados_opt.chunk_bytes == 0) {
      std::optional<uint64_t> bytes = ChunkBytesOf(rados_config, "--chunk-bytes");
      if (!bytes) return 1;
      rados_opt.chunk_bytes = *bytes;
    }
    rados_opt.source_dir = KVC_SOURCE_DIR;
    return PrintReport(bench::RunRadosBench(rados_opt), json, bench::RadosBenchToText);
  }
#endif
  if (restart->parsed()) {
    restart_opt.kvcached = SiblingKvcached();
    return PrintReport(bench::RunRestartBench(restart_opt), json, bench::RestartToText);
  }
  if (fairness->parsed()) {
    fair_opt.kvcached = SiblingKvcached();
    return PrintReport(bench::RunFairnessBench(fair_opt), json, bench::FairnessToText);
  }
  if (soak->parsed()) {
    std::optional<std::string> text = ReadModelConfig(soak_config);
    if (!text) return 1;
    soak_opt.model_config_json = *text;
    soak_opt.kvcached = SiblingKvcached();
    absl::StatusOr<nlohmann::json> r = bench::RunSoak(soak_opt);
    const int code = PrintReport(r, json, bench::SoakToText);
    return code != 0 ? code : (bench::SoakPassed(*r) ? 0 : 1);
  }
  if (cluster->parsed()) {
    std::optional<std::string> text = ReadModelConfig(cluster_config);
    if (!text) return 1;
    copt.model_config_json = *text;
    copt.kvcached = SiblingKvcached();
    return PrintReport(bench::RunClusterBench(copt), json, bench::ClusterBenchToText);
  }
  if (trace->parsed()) {
    std::optional<std::string> text = ReadModelConfig(trace_config);
    if (!text) return 1;
    topt.model_config_json = *text;
    topt.kvcached = SiblingKvcached();
    return PrintReport(bench::RunTraceBench(topt), json, bench::TraceBenchToText);
  }
  if (e2e->parsed()) {
    xopt.kvcached = SiblingKvcached();
    xopt.source_dir = KVC_SOURCE_DIR;
    return PrintReport(bench::RunE2eBench(xopt), json, bench::E2eBenchToText);
  }
  if (engine->parsed()) {
    return PrintReport(bench::RunEngineBench(eopt), json, bench::EngineBenchToText);
  }
  if (service->parsed()) {
    std::optional<std::string> text = ReadModelConfig(config);
    if (!text) return 1;
    sopt.model_config_json = *text;
    sopt.kvcached = SiblingKvcached();
    if (no_python) sopt.python_dir.clear();
    sopt.kvcached_args = absl::StrSplit(kvcached_args, ' ', absl::SkipEmpty());
    absl::StatusOr<std::vector<bench::ServiceCase>> cases = bench::RunServiceBench(sopt);
    return PrintReport(
        cases.ok() ? absl::StatusOr<nlohmann::json>(bench::ServiceCasesToJson(*cases))
                   : cases.status(),
        json, [&](const nlohmann::json&) {
          return absl::StrCat(sopt.seconds, " s per run, ", sopt.repetitions,
                              " alternated runs per case\n", bench::ServiceCasesToText(*cases));
        });
  }
  opt.run_fio = !no_fio;
  if (storage_sizes.empty()) {
    std::optional<uint64_t> bytes = ChunkBytesOf(config, "--chunk-bytes");
    if (!bytes) return 1;
    storage_sizes.push_back(*bytes);
  }
  // Each size in turn, its peers beside it (one JSON object per size: an array for several).
  nlohmann::json all = nlohmann::json::array();
  const uint64_t dataset_chunks = opt.dataset_chunks;
  for (uint64_t size : storage_sizes) {
    opt.chunk_bytes = size;
    opt.dataset_chunks =
        dataset_bytes > 0 ? std::max<uint64_t>(1, dataset_bytes / size) : dataset_chunks;
    absl::StatusOr<std::vector<bench::BenchCase>> cases = bench::RunStorageBench(opt);
    if (json && storage_sizes.size() > 1) {
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
  if (json && storage_sizes.size() > 1) std::cout << all.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) {
  // Chunks fetched and stored pass through chunk-sized buffers: keep them warm (base/heap.h).
  kvc::KeepLargeBuffersInHeap(kvc::kClientHeap);
  return kvc::Main(argc, argv);
}
