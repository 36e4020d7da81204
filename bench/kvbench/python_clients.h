// PythonClients: the Python package's fetch loop (bench/kvbench/python_fetch.py) in
// separate processes, one per client, so `kvbench service` measures the Python client
// beside the C++ one in the same run. The processes start once and stay warm; each run
// tells the first n of them to fetch for a number of seconds and merges their counts and
// latencies into one Sample.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/kvbench/harness.h"

namespace kvc::bench {

struct PythonClientsOptions {
  std::string python = "/usr/bin/python3";  // Debian's, with python3-grpcio and friends
  std::string package_dir;                  // python/ of the source tree (PYTHONPATH)
  std::string script;                       // bench/kvbench/python_fetch.py
  std::string target;                       // kvcached address
  std::string shm_socket;                   // empty: gRPC only
  std::string config_file, keys_file;       // the namespace's config; one hex key per line
  int per_call = 1;
  std::string api = "client";  // client, sglang or vllm (python_fetch.py --api)
  bool native_fetch = true;    // false: through grpcio (python_fetch.py --no-native-fetch)
};

class PythonClients {
 public:
  // Starts n clients and waits until each is connected and warm. FailedPrecondition
  // naming what to install when the interpreter or the package is missing.
  static absl::StatusOr<std::unique_ptr<PythonClients>> Start(const PythonClientsOptions& options,
                                                              int n);
  ~PythonClients();
  PythonClients(const PythonClients&) = delete;
  PythonClients& operator=(const PythonClients&) = delete;

  // The first n clients fetch for `seconds`, all at once.
  absl::StatusOr<Sample> Run(int n, double seconds, uint64_t bytes_per_call);

 private:
  PythonClients() = default;
  struct Worker {
    pid_t pid = -1;
    FILE* to = nullptr;    // its stdin
    FILE* from = nullptr;  // its stdout
  };
  std::vector<Worker> workers_;
};

}  // namespace kvc::bench
