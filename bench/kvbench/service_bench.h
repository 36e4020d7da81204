// kvbench service: fetch and store of whole chunks through kvcached — over gRPC on
// loopback, and through the shared RAM arena for a co-located client, with the C++ client
// and (fetches) the Python one — beside Redis on
// loopback (same values, same number of clients) and memcpy, in the same run,
// alternating ours and the peers and reporting medians.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct ServiceBenchOptions {
  std::string dir;                // scratch folder (daemon data, Redis dir)
  std::string kvcached;           // path of the kvcached binary
  std::string model_config_json;  // namespace to register (its chunk size is used)
  double seconds = 1.0;
  int repetitions = 3;
  std::vector<int> clients = {1, 8};
  int dataset_chunks = 64;
  int chunks_per_call = 1;  // fetch: chunks per call (a prefix); Redis pipelines its GETs
  std::vector<std::string> ops = {"fetch", "call", "store"};  // what to measure (stores last)
  // kvcache-shm keeps leases between fetches (the client's default); off, every fetch
  // pays a FetchRefs round trip.
  bool shm_lease_cache = true;
  // Stores durable: kvcached with an SSD tier acknowledges each Store stream's chunks once
  // they are synced (batches of --durable-store-batch, --durable-store-in-flight of them
  // being written at once), and Redis runs with its append-only file synced before every
  // reply (appendfsync always) — both on --dir's disk. Off: both keep stores in memory.
  bool durable_stores = false;
  // More kvcached options (e.g. {"--durable-store-in-flight", "1"}), to compare settings.
  std::vector<std::string> kvcached_args;
  // python/ of the source tree: also measure the Python client (python-grpc, python-shm
  // fetches, bench/kvbench/python_fetch.py beside it) and the engine adapters over it
  // (sglang-grpc, sglang-shm, vllm-grpc; they need python3-torch). Empty: skip them.
  std::string python_dir;
  std::string python_fetch_script;
};

struct ServiceCase {
  // system: kvcache-grpc, kvcache-shm, python-grpc, python-shm, sglang-grpc, sglang-shm,
  // vllm-grpc, redis or memcpy; op: fetch,
  // store or call (the smallest call: a one-key Lookup against a Redis EXISTS; gbps 0)
  std::string system, op;
  int clients = 0;
  int chunks_per_call = 1;
  double gbps = 0, p50_us = 0, p99_us = 0;
  // The server process's CPU (user + system, /proc/PID/stat) per chunk moved (per call for
  // "call"): kvcached for the kvcache and python systems, redis-server for redis; -1 for
  // memcpy. Medians of the runs, like the rest.
  double server_cpu_us_per_chunk = -1;
};

absl::StatusOr<std::vector<ServiceCase>> RunServiceBench(const ServiceBenchOptions& options);
nlohmann::json ServiceCasesToJson(const std::vector<ServiceCase>& cases);
std::string ServiceCasesToText(const std::vector<ServiceCase>& cases);

}  // namespace kvc::bench
