#include "bench/kvbench/service_bench.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "bench/kvbench/python_clients.h"
#include "bench/kvbench/report.h"
#include "client/client.h"
#include "serve/kvcached_process.h"

namespace kvc::bench {
namespace {

struct Process {
  pid_t pid = -1;
  ~Process() { Stop(); }
  void Stop() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
};

// Starts argv (the Redis peer) with stdout on a pipe; returns the first line it prints.
absl::StatusOr<std::string> Spawn(const std::vector<std::string>& argv, Process* p) {
  // Made before fork: the child of a threaded process may only make async-signal-safe
  // calls before exec (no allocation).
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  p->pid = fork();
  if (p->pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[512] = {0};
  const bool got = fgets(line, sizeof line, f) != nullptr;
  // Keep draining the child's output so it never blocks on a full pipe.
  std::thread([f] {
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) {
    }
    fclose(f);
  }).detach();
  if (!got) return absl::InternalError(absl::StrCat(argv[0], " printed nothing"));
  return std::string(line);
}

}  // namespace

absl::StatusOr<std::vector<ServiceCase>> RunServiceBench(const ServiceBenchOptions& opt) {
  std::error_code ec;
  std::filesystem::remove_all(opt.dir, ec);
  std::filesystem::create_directories(opt.dir + "/redis", ec);
  // Ours: RAM tier big enough for the data set and the store runs' steady-state eviction.
  // With durable stores, an SSD tier to sync them to (fresh prefixes: it fills and evicts).
  std::vector<std::string> daemon_args = {"--ram-bytes", std::to_string(512ull << 20),
                                          "--ssd-bytes",
                                          opt.durable_stores ? std::to_string(4ull << 30) : "0"};
  daemon_args.insert(daemon_args.end(), opt.kvcached_args.begin(), opt.kvcached_args.end());
  serve::KvcachedProcess daemon(opt.kvcached, opt.dir + "/kvcached", daemon_args);
  KVC_RETURN_IF_ERROR(daemon.Start());
  const std::string address = daemon.address();
  Process redis;
  const int redis_port = FreeLoopbackPort();
  absl::StatusOr<std::string> rline = Spawn({"/usr/bin/redis-server",
                                             "--port",
                                             std::to_string(redis_port),
                                             "--bind",
                                             "127.0.0.1",
                                             "--save",
                                             "",
                                             "--appendonly",
                                             opt.durable_stores ? "yes" : "no",
                                             "--appendfsync",
                                             "always",
                                             "--auto-aof-rewrite-percentage",
                                             "0",
                                             "--dir",
                                             opt.dir + "/redis",
                                             "--maxmemory",
                                             "512mb",
                                             "--maxmemory-policy",
                                             "allkeys-lru",
                                             "--protected-mode",
                                             "no"},
                                            &redis);
  if (!rline.ok())
    return absl::FailedPreconditionError(
        "redis-server did not start (scripts/install-deps.sh installs it)");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  const client::ClientOptions copt{.address = address,
                                   .bearer_token = "",
                                   .timeout_ms = 30000,
                                   .tls_ca_file = "",
                                   .shm_socket = ""};
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<client::CacheClient> setup,
                       client::CacheClient::Connect(copt));
  KVC_ASSIGN_OR_RETURN(client::RemoteNamespace ns,
                       setup->RegisterNamespace(opt.model_config_json, "kvbench"));
  const uint64_t chunk = ns.chunk_bytes;
  std::vector<uint8_t> payload(chunk);
  std::mt19937_64 rng(chunk);
  for (auto& b : payload) b = static_cast<uint8_t>(rng());

  const int max_clients = *std::max_element(opt.clients.begin(), opt.clients.end());
  std::vector<std::unique_ptr<client::CacheClient>> clients, shm_clients;
  std::vector<redisContext*> redis_clients;
  client::ClientOptions shm_opt = copt;
  shm_opt.shm_socket = daemon.shm_socket();
  shm_opt.shm_lease_cache = opt.shm_lease_cache;
  for (int c = 0; c < max_clients; ++c) {
    clients.push_back(*client::CacheClient::Connect(copt));
    shm_clients.push_back(*client::CacheClient::Connect(shm_opt));
    if (!shm_clients.back()->shared_memory()) {
      return absl::UnavailableError("shared arena: " + shm_clients.back()->shared_memory_error());
    }
    redisContext* r = redisConnect("127.0.0.1", redis_port);
    if (r == nullptr || r->err) return absl::UnavailableError("cannot connect to redis-server");
    redis_clients.push_back(r);
  }
  // The data set: prefixes of one chunk each (tokens differ per chunk).
  std::vector<std::vector<uint32_t>> tokens(opt.dataset_chunks);
  std::vector<storage::ChunkKey> keys;
  for (int i = 0; i < opt.dataset_chunks; ++i) {
    for (uint32_t t = 0; t < ns.chunk_tokens; ++t) tokens[i].push_back((i * 7919 + t) % 512);
    KVC_ASSIGN_OR_RETURN(client::StoreResult r, setup->Store(ns, std::nullopt, tokens[i], payload,
                                                             client::Durability::kMemory));
    keys.push_back(r.keys[0]);
    redisReply* rep = static_cast<redisReply*>(
        redisCommand(redis_clients[0], "SET chunk:%d %b", i, payload.data(), payload.size()));
    if (rep == nullptr) return absl::UnavailableError("redis SET failed");
    freeReplyObject(rep);
  }

  std::atomic<uint64_t> next_token{1};
  const int per_call = std::clamp(opt.chunks_per_call, 1, opt.dataset_chunks);
  std::vector<std::vector<uint8_t>> outs(max_clients, std::vector<uint8_t>(per_call * chunk));
  std::vector<uint8_t> store_payload;  // what one Store call sends: per_call chunks
  for (int k = 0; k < per_call; ++k)
    store_payload.insert(store_payload.end(), payload.begin(), payload.end());
  // Call i of client c fetches chunks first(i, c) … + per_call - 1.
  auto first = [&](uint64_t i, int c) {
    return static_cast<size_t>((i * 31 + c) % (keys.size() - per_call + 1));
  };
  // The arena the memcpy peer reads from: the same values, in this process's memory.
  std::vector<uint8_t> arena(static_cast<size_t>(opt.dataset_chunks) * chunk);
  for (int i = 0; i < opt.dataset_chunks; ++i)
    std::memcpy(arena.data() + i * chunk, payload.data(), chunk);
  auto copy = [&](const std::string& op) -> std::function<absl::Status(int, uint64_t)> {
    return [&, op](int c, uint64_t i) {
      if (op == "fetch") {
        for (int k = 0; k < per_call; ++k) {
          std::memcpy(outs[c].data() + k * chunk, arena.data() + (first(i, c) + k) * chunk, chunk);
        }
      } else {
        for (int k = 0; k < per_call; ++k) {
          std::memcpy(arena.data() + ((i * 31 + c + k) % keys.size()) * chunk, payload.data(),
                      chunk);
        }
      }
      return absl::OkStatus();
    };
  };
  auto ours = [&](const std::string& op, bool shm) -> std::function<absl::Status(int, uint64_t)> {
    if (op == "call") {
      // The smallest call there is: a unary Lookup of one key, no payload. Its latency is
      // the floor under every call of ours, whatever it carries.
      return [&](int c, uint64_t i) -> absl::Status {
        KVC_ASSIGN_OR_RETURN(
            client::LookupResult r,
            clients[c]->LookupKeysEvery(ns, std::span(keys).subspan(first(i, c), 1)));
        return r.matched_chunks == 1 ? absl::OkStatus() : absl::InternalError("lookup missed");
      };
    }
    if (op == "fetch") {
      return [&, shm](int c, uint64_t i) -> absl::Status {
        KVC_ASSIGN_OR_RETURN(size_t n,
                             (shm ? shm_clients : clients)[c]->Fetch(
                                 ns, std::span(keys).subspan(first(i, c), per_call), outs[c]));
        return n == static_cast<size_t>(per_call) ? absl::OkStatus()
                                                  : absl::InternalError("fetch missed");
      };
    }
    return [&](int c, uint64_t) -> absl::Status {
      // A fresh prefix of per_call chunks each time (its first chunk's tokens are new), in
      // one Store stream.
      std::vector<uint32_t> t(per_call * ns.chunk_tokens, 0);
      const uint64_t n = next_token++;
      for (size_t k = 0; k < 4; ++k) t[k] = static_cast<uint32_t>((n >> (9 * k)) & 511);
      return clients[c]
          ->Store(ns, std::nullopt, t, store_payload,
                  opt.durable_stores ? client::Durability::kDurable : client::Durability::kMemory)
          .status();
    };
  };
  auto peer = [&](const std::string& op) -> std::function<absl::Status(int, uint64_t)> {
    if (op == "call") {  // Redis's smallest call on a key: EXISTS
      return [&](int c, uint64_t i) -> absl::Status {
        redisReply* r = static_cast<redisReply*>(
            redisCommand(redis_clients[c], "EXISTS chunk:%d", static_cast<int>(first(i, c))));
        if (r == nullptr) return absl::InternalError("redis EXISTS failed");
        const bool one = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        return one ? absl::OkStatus() : absl::InternalError("redis EXISTS missed");
      };
    }
    if (op == "fetch") {
      return [&](int c, uint64_t i) -> absl::Status {
        // Pipelined GETs: one round trip for the whole prefix, like our one Fetch stream.
        for (int k = 0; k < per_call; ++k) {
          redisAppendCommand(redis_clients[c], "GET chunk:%d", static_cast<int>(first(i, c) + k));
        }
        for (int k = 0; k < per_call; ++k) {
          void* reply = nullptr;
          if (redisGetReply(redis_clients[c], &reply) != REDIS_OK)
            return absl::InternalError("redis GET failed");
          redisReply* r = static_cast<redisReply*>(reply);
          if (r->type != REDIS_REPLY_STRING || r->len != static_cast<size_t>(chunk)) {
            freeReplyObject(r);
            return absl::InternalError("redis GET returned another value");
          }
          std::memcpy(outs[c].data() + k * chunk, r->str,
                      chunk);  // into the caller's buffer, as ours does
          freeReplyObject(r);
        }
        return absl::OkStatus();
      };
    }
    return [&](int c, uint64_t) -> absl::Status {
      // Pipelined SETs: one round trip for the whole prefix, like our one Store stream.
      const uint64_t n = next_token++;
      for (int k = 0; k < per_call; ++k) {
        redisAppendCommand(redis_clients[c], "SET new:%llu:%d %b",
                           static_cast<unsigned long long>(n), k, payload.data(), payload.size());
      }
      for (int k = 0; k < per_call; ++k) {
        void* reply = nullptr;
        if (redisGetReply(redis_clients[c], &reply) != REDIS_OK) {
          return absl::InternalError("redis SET failed");
        }
        freeReplyObject(reply);
      }
      return absl::OkStatus();
    };
  };

  // The Python client's processes, warm for the whole benchmark.
  std::map<std::string, std::unique_ptr<PythonClients>> python;
  std::vector<std::string> systems = {"kvcache-grpc", "kvcache-shm", "redis", "memcpy"};
  if (!opt.python_dir.empty()) {
    PythonClientsOptions po;
    po.package_dir = opt.python_dir;
    po.script = opt.python_fetch_script;
    po.target = address;
    po.per_call = per_call;
    po.config_file = opt.dir + "/config.json";
    po.keys_file = opt.dir + "/keys.txt";
    std::ofstream(po.config_file) << opt.model_config_json;
    std::ofstream key_lines(po.keys_file);
    for (const storage::ChunkKey& k : keys) key_lines << k.Hex() << "\n";
    key_lines.close();
    // The plain client, the same through grpcio alone (its fetch without the native library:
    // the peer that shows what the library is worth), then the engine adapters over it
    // (python_fetch.py --api).
    for (const std::string system :
         {"python-grpc", "python-grpcio", "python-shm", "sglang-grpc", "sglang-shm", "vllm-grpc"}) {
      po.shm_socket = system.ends_with("-shm") ? daemon.shm_socket() : "";
      po.api = system.starts_with("sglang") ? "sglang"
               : system.starts_with("vllm") ? "vllm"
                                            : "client";
      po.native_fetch = system != "python-grpcio";
      KVC_ASSIGN_OR_RETURN(std::unique_ptr<PythonClients> p, PythonClients::Start(po, max_clients));
      python[system] = std::move(p);
      systems.push_back(system);
    }
  }
  // What a server process has spent on the CPU so far (utime + stime), in µs.
  auto cpu_us = [](pid_t pid) -> double {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) return -1;
    std::istringstream fields(stat.substr(close + 2));
    std::string f;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {  // field 3 is the state
      if (i == 14) utime = std::stod(f);
      if (i == 15) stime = std::stod(f);
    }
    return (utime + stime) * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
  };
  std::vector<ServiceCase> cases;
  for (const std::string op : {"fetch", "call", "store"}) {  // stores last: they evict
    if (std::find(opt.ops.begin(), opt.ops.end(), op) == opt.ops.end()) continue;
    for (int n : opt.clients) {
      std::map<std::string, std::vector<Sample>> runs;
      std::map<std::string, std::vector<double>> server_cpu;  // µs per chunk, per run
      for (int rep = 0; rep < opt.repetitions; ++rep) {
        for (const std::string& system : systems) {
          if (system == "kvcache-shm" && op == "store") continue;  // stores go over gRPC
          if (python.contains(system) && op == "store") continue;  // fetches only
          // The call floor: one gRPC call against one Redis command.
          if (op == "call" && system != "kvcache-grpc" && system != "redis") continue;
          std::fprintf(stderr, "kvbench: %s %s %d clients run %d\n", system.c_str(), op.c_str(), n,
                       rep + 1);
          const uint64_t bytes_per_call = op == "call" ? 0 : per_call * chunk;
          const pid_t server = system == "memcpy"  ? -1
                               : system == "redis" ? redis.pid
                                                   : daemon.pid();
          const double cpu_before = server > 0 ? cpu_us(server) : -1;
          absl::StatusOr<Sample> s;
          if (python.contains(system)) {
            s = python[system]->Run(n, opt.seconds, bytes_per_call);
          } else {
            const auto fn = system == "redis"    ? peer(op)
                            : system == "memcpy" ? copy(op)
                                                 : ours(op, system == "kvcache-shm");
            s = LoopThreads(opt.seconds, n, bytes_per_call, fn);
          }
          if (!s.ok())
            return absl::Status(s.status().code(),
                                absl::StrCat(system, " ", op, ": ", s.status().message()));
          if (server > 0 && cpu_before >= 0) {
            const double units = op == "call" ? static_cast<double>(s->lat_us.size())
                                              : static_cast<double>(s->bytes) / chunk;
            if (units > 0) server_cpu[system].push_back((cpu_us(server) - cpu_before) / units);
          }
          runs[system].push_back(*std::move(s));
        }
      }
      for (const std::string& system : systems) {
        if (runs[system].empty()) continue;
        std::vector<double> gbps, p50, p99;
        for (Sample& s : runs[system]) {
          s.Percentiles();
          gbps.push_back(s.gbps());
          p50.push_back(s.p50_us);
          p99.push_back(s.p99_us);
        }
        cases.push_back({system, op, n, per_call, Median(gbps), Median(p50), Median(p99),
                         server_cpu[system].empty() ? -1 : Median(server_cpu[system])});
      }
    }
  }
  python.clear();
  for (redisContext* r : redis_clients) redisFree(r);
  clients.clear();
  shm_clients.clear();
  setup.reset();
  daemon.Stop(SIGTERM);
  redis.Stop();
  std::filesystem::remove_all(opt.dir, ec);
  return cases;
}

nlohmann::json ServiceCasesToJson(const std::vector<ServiceCase>& cases) {
  nlohmann::json j;
  j["cases"] = nlohmann::json::array();
  for (const ServiceCase& c : cases) {
    j["cases"].push_back({{"system", c.system},
                          {"op", c.op},
                          {"clients", c.clients},
                          {"chunks_per_call", c.chunks_per_call},
                          {"gbps", c.gbps},
                          {"p50_us", c.p50_us},
                          {"p99_us", c.p99_us},
                          {"server_cpu_us_per_chunk", c.server_cpu_us_per_chunk}});
  }
  return j;
}

std::string ServiceCasesToText(const std::vector<ServiceCase>& cases) {
  std::string out = absl::StrFormat("%-6s %7s  %-13s %9s %10s %10s %12s\n", "op", "clients",
                                    "system", "GB/s", "p50 us", "p99 us", "srv us/chunk");
  std::map<std::tuple<std::string, int, std::string>, double> gbps, p50;
  for (const ServiceCase& c : cases) {
    absl::StrAppendFormat(
        &out, "%-6s %7d  %-13s %9.3f %10.1f %10.1f %12s\n", c.op, c.clients, c.system, c.gbps,
        c.p50_us, c.p99_us,
        c.server_cpu_us_per_chunk >= 0 ? absl::StrFormat("%.1f", c.server_cpu_us_per_chunk) : "-");
    gbps[{c.op, c.clients, c.system}] = c.gbps;
    p50[{c.op, c.clients, c.system}] = c.p50_us;
  }
  out += "\nratios (medians of alternated runs):\n";
  for (const ServiceCase& c : cases) {
    if (c.op == "call") {  // no payload: latency, not GB/s
      const double r = p50[{"call", c.clients, "redis"}];
      if (c.system == "kvcache-grpc" && r > 0) {
        absl::StrAppendFormat(&out, "  %-6s %2d clients  p50 %s / redis %6.2f\n", c.op, c.clients,
                              c.system, c.p50_us / r);
      }
      continue;
    }
    const char* peer = c.system == "kvcache-grpc"    ? "redis"
                       : c.system == "kvcache-shm"   ? "memcpy"
                       : c.system == "python-grpc"   ? "kvcache-grpc"
                       : c.system == "python-grpcio" ? "kvcache-grpc"
                       : c.system == "python-shm"    ? "kvcache-shm"
                       : c.system == "sglang-grpc"   ? "python-grpc"
                       : c.system == "sglang-shm"    ? "python-shm"
                       : c.system == "vllm-grpc"     ? "python-grpc"
                                                     : nullptr;
    if (peer == nullptr) continue;
    const double p = gbps[{c.op, c.clients, peer}];
    if (p <= 0) continue;
    // Targets: gRPC at Redis's speed, shared memory near memcpy, the Python client's gRPC
    // and an engine adapter within 10 % of the client they are measured against.
    const bool adapter = c.system.starts_with("sglang") || c.system.starts_with("vllm");
    const double target = c.op != "fetch" || c.system == "python-grpcio" ? 0
                          : c.system == "kvcache-grpc"                   ? 1.0
                          : adapter || c.system == "python-grpc"         ? 0.9
                                                                         : 0.8;
    absl::StrAppendFormat(&out, "  %-6s %2d clients  %s / %-7s %6.2f%s\n", c.op, c.clients,
                          c.system, peer, c.gbps / p, RatioNote(c.gbps / p, target));
  }
  out += "\nserver CPU per chunk (per call for call), ours / redis's:\n";
  std::map<std::tuple<std::string, int>, double> redis_cpu;
  for (const ServiceCase& c : cases) {
    if (c.system == "redis") redis_cpu[{c.op, c.clients}] = c.server_cpu_us_per_chunk;
  }
  for (const ServiceCase& c : cases) {
    if (c.system != "kvcache-grpc" || c.server_cpu_us_per_chunk < 0) continue;
    const double r = redis_cpu[{c.op, c.clients}];
    if (r <= 0) continue;
    absl::StrAppendFormat(&out, "  %-6s %2d clients  %.1f us / %.1f us = %.2f\n", c.op, c.clients,
                          c.server_cpu_us_per_chunk, r, c.server_cpu_us_per_chunk / r);
  }
  return out;
}

}  // namespace kvc::bench
