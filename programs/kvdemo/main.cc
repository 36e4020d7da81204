// kvdemo: a coding-agent session over several turns on the mini model, resumed from
// kvcached each turn, with kvcached restarted in the middle ("the next day") so the
// following turn resumes from SSD. Every turn is also prefilled cold, in the same run, for
// the TTFT comparison. Starts its own kvcached on a scratch folder and removes both at the
// end.
//
// With --nodes N (≥ 2) the cache is a cluster instead: etcd and N kvcached nodes on
// loopback (docs/cluster.md), chunks on 2 nodes each; halfway one node is killed with
// SIGKILL for a turn and then restarted on its folder, and the table says which nodes
// served each turn.
//
//   kvdemo [--turns N] [--initial-tokens N] [--tool-tokens N] [--generate N]
//          [--replay bounded|exact] [--nodes N | --cache ADDR]
//
// --cache ADDR runs the session against a cache that is already running — one kvcached
// (HOST:PORT) or a cluster (etcd://H:P) — with no restart or kill (those need processes of
// its own).
//          [--source-dir DIR] [--keep] [--json]
//
// The session's text is real: a system prompt, then this repository's source files (read
// from --source-dir, default the checkout the binary was built in), then per turn a "tool
// result" (another file) and the model's answer; a byte-level tokenizer turns text into
// token ids (engine/spec/byte_tokens.h). The model is the replay-aware small V4.1 trained
// in train/ (train/weights/small-replay.safetensors, configs/small.json), so each turn
// prints the start of a real continuation; --random-weights runs configs/mini.json with
// random weights instead (answers are noise). The cache, the replay and the timings are
// real either way.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/program_flags.h"
#include "backends/select.h"
#include "base/heap.h"
#include "engine/model/generate.h"
#include "engine/model/weights.h"
#include "engine/spec/byte_tokens.h"
#include "nlohmann/json.hpp"
#include "serve/embedded_mini_config.h"
#include "serve/kvcached_process.h"
#include "serve/local_ceph.h"
#include "serve/local_cluster.h"
#include "serve/session.h"

namespace kvc::serve {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string ReadText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Text for the session: the repository's own files when readable, else generated prose.
std::vector<std::string> SourceFiles(const fs::path& root) {
  std::vector<std::string> files;
  for (const char* f : {"docs/storage.md", "docs/service.md", "docs/model.md",
                        "engine/model/model.h", "client/client.h", "storage/chunk_store.h",
                        "docs/kv-format.md", "docs/prefix-hashing.md", "engine/spec/chunk_layout.h",
                        "serve/cache_connector.h", "docs/benchmarks.md", "README.md"}) {
    std::string t = ReadText(root / f);
    if (!t.empty()) files.push_back(absl::StrCat("=== ", f, " ===\n", t));
  }
  if (files.empty()) {
    for (int i = 0; i < 12; ++i) {
      std::string t = absl::StrCat("=== file", i, ".txt ===\n");
      for (int j = 0; j < 400; ++j) absl::StrAppend(&t, "line ", j, " of file ", i, ": cache me\n");
      files.push_back(t);
    }
  }
  return files;
}

const char kSystemPrompt[] =
    "You are a coding agent working in a C++ repository that implements a tiered, "
    "persistent KV-cache service and the inference engine that resumes from it. Read the "
    "files you are given, run tools when you need facts, and answer with precise, tested "
    "changes. Keep the architecture visible: each folder one job, one-way dependencies. ";

// The start of an answer for one line of the table: its bytes, with what would break the
// line (newlines, tabs, other control bytes) written as escapes, at most `max_chars` long.
std::string AnswerSample(const std::vector<uint32_t>& tokens, size_t max_chars) {
  std::string out = "\"";
  for (char ch : DecodeBytes(tokens)) {
    if (out.size() > max_chars) {
      out += "…";
      break;
    }
    const auto b = static_cast<unsigned char>(ch);
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7F) {
      out += absl::StrFormat("\\x%02x", b);
    } else {
      out.push_back(ch);
    }
  }
  return out + "\"";
}

int Main(int argc, char** argv) {
  CLI::App app{"kvdemo: a multi-day coding-agent session resumed from kvcached"};
  int turns = 6, nodes = 1;
  std::string external_cache;
  int64_t tool_tokens = 2048, generate = 128, initial_tokens = 12288;
  std::string replay = "bounded", source_dir, backend = "cpu";
  bool keep = false, json = false, rados = false;
  app.add_option("--turns", turns, "turns in the session")
      ->check(CLI::Range(2, 100))
      ->capture_default_str();
  app.add_option("--tool-tokens", tool_tokens, "tokens of tool output per turn")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--initial-tokens", initial_tokens,
                 "first turn's context: the system prompt and files, cut to this many tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--generate", generate, "tokens generated per turn")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  model::AddReplayFlag(app, replay);
  app.add_option("--source-dir", source_dir, "repository whose files make up the session");
  CLI::Option* nodes_opt =
      app.add_option("--nodes", nodes, "1: one kvcached; N ≥ 2: a cluster of N nodes on etcd")
          ->check(CLI::Range(1, 16))
          ->capture_default_str();
  app.add_option("--cache", external_cache,
                 "use this running cache instead (HOST:PORT or etcd://H:P); no restart step")
      ->excludes(nodes_opt);
  app.add_flag(
         "--rados", rados,
         "a single-host Ceph cluster as the shared tier below every node (scripts/ceph-up.sh; "
         "Ceph from scripts/install-deps.sh); halfway every node is killed and its folder "
         "deleted, and the session resumes from RADOS")
      ->excludes("--cache");
  model::AddBackendFlag(app, backend);
  app.add_flag("--keep", keep, "keep the scratch folder (weights, kvcached data and log)");
  std::string weights_opt, config_opt;
  bool random_weights = false;
  app.add_option("--weights", weights_opt,
                 "trained weights (default: SOURCE_DIR/train/weights/small-replay.safetensors)");
  app.add_option("--config", config_opt, "their config (default: SOURCE_DIR/configs/small.json)");
  app.add_flag("--random-weights", random_weights,
               "configs/mini.json with random weights (seed 1) instead of a trained model");
  app.add_flag("--json", json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvdemo: error: " << e.what() << " (run kvdemo --help)\n";
    return 2;
  }
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  if (source_dir.empty()) source_dir = KVC_SOURCE_DIR;
  char tmpl[] = "/tmp/kvdemo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::cerr << "kvdemo: error: cannot create a scratch folder in /tmp\n";
    return 1;
  }
  const fs::path work = tmpl;
  auto fail = [&](const std::string& m) {
    std::cerr << "kvdemo: error: " << m << "\n";
    if (!keep) fs::remove_all(work);
    return 1;
  };
  auto say = [&](const std::string& m) {
    if (!json) std::cout << m << std::flush;
  };

  // The model: the shipped trained one unless asked otherwise (or missing), else random.
  const bool asked_for_weights = !weights_opt.empty();
  if (weights_opt.empty()) weights_opt = source_dir + "/train/weights/small-replay.safetensors";
  if (config_opt.empty()) config_opt = source_dir + "/configs/small.json";
  bool trained = !random_weights;
  if (trained && !fs::exists(weights_opt)) {
    if (asked_for_weights) return fail(absl::StrCat("--weights ", weights_opt, " does not exist"));
    say(absl::StrCat("kvdemo: no trained weights at ", weights_opt, "; random weights instead\n"));
    trained = false;
  }
  std::string config_text = kEmbeddedMiniConfig, config_name = "configs/mini.json";
  if (trained) {
    std::ifstream in(config_opt);
    if (!in) return fail(absl::StrCat("cannot read --config ", config_opt));
    config_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    config_name = config_opt;
  }
  absl::StatusOr<ModelConfig> config = ParseModelConfig(config_text, config_name);
  if (!config.ok()) return fail(std::string(config.status().message()));
  if (!HoldsByteTokens(config->vocab_size))
    return fail(absl::StrCat(config_name, ": its vocabulary does not hold the byte tokens"));
  absl::StatusOr<LayerSchedule> schedule = BuildLayerSchedule(*config);
  if (!schedule.ok()) return fail(std::string(schedule.status().message()));
  std::string weights = weights_opt;
  if (!trained) {
    weights = (work / "mini.safetensors").string();
    if (absl::Status s = model::WriteRandomWeights(*config, *schedule, 1, weights); !s.ok())
      return fail(std::string(s.message()));
  }
  model::ModelOptions options;
  if (absl::Status st = model::SelectBackends(backend, replay == "exact", options); !st.ok())
    return fail(std::string(st.message()));
  absl::StatusOr<std::unique_ptr<model::Model>> loaded =
      model::Model::Load(*config, weights, std::move(options));
  if (!loaded.ok()) return fail(std::string(loaded.status().message()));
  const model::Model& m = **loaded;
  say(absl::StrFormat(
      "kvdemo: %s model (%d layers, %d-token window, %.0f B/token of global KV, %d-token "
      "chunks), %s; scratch folder %s\n",
      trained ? "small" : "mini", config->num_hidden_layers, config->sliding_window,
      m.layout().bytes_per_token(), m.layout().chunk_tokens,
      trained ? absl::StrCat("trained weights ", weights) : std::string("random weights"),
      work.string()));

  std::vector<std::string> capacity = {"--ram-bytes", "268435456", "--ssd-bytes", "1073741824"};
  std::unique_ptr<LocalCeph> ceph;  // ended with the demo, however it ends
  if (rados) {
    say("kvdemo: starting a single-host Ceph cluster (one monitor, one memstore OSD)\n");
    absl::StatusOr<std::unique_ptr<LocalCeph>> up =
        LocalCeph::Start(source_dir, (work / "ceph").string(), "kvcache");
    if (!up.ok()) return fail(std::string(up.status().message()));
    ceph = *std::move(up);
    const std::vector<std::string> shared = ceph->KvcachedFlags();
    capacity.insert(capacity.end(), shared.begin(), shared.end());
  }
  KvcachedProcess daemon((bin / "kvcached").string(), (work / "kvcached").string(), capacity);
  std::vector<std::string> node_flags = capacity;
  node_flags.insert(node_flags.end(), {"--cluster-lease-seconds", "2"});
  // Under RADOS one copy on the nodes is enough: RADOS holds the durable one (R = 1).
  if (rados) node_flags.insert(node_flags.end(), {"--replicas", "1"});
  LocalCluster cluster((bin / "kvcached").string(), (work / "cluster").string(), nodes, node_flags);
  ConnectorOptions copt;
  copt.model_config_json = config_text;
  copt.model_id = trained ? fs::path(weights).stem().string() : "mini-seed1";
  copt.replay = replay == "exact" ? model::ReplayMode::kExact : model::ReplayMode::kBounded;
  // On the GPU the chunks a co-located kvcached holds in HBM come out over CUDA IPC.
  if (backend != "cpu") copt.hbm_reader = model::MakeHbmChunkReader();
  if (!external_cache.empty()) {
    say(absl::StrCat("kvdemo: the cache at ", external_cache, "\n"));
    copt.client.address = external_cache;
  } else if (nodes > 1) {
    std::filesystem::create_directories(work / "cluster");
    if (absl::Status s = cluster.Start(); !s.ok()) return fail(std::string(s.message()));
    say(absl::StrCat("kvdemo: etcd and ", nodes, " kvcached nodes (", cluster.url(),
                     "), each chunk on ", rados ? "1 of them and in RADOS" : "2 of them", "\n"));
    copt.client.address = cluster.url();
    if (rados) copt.client.replicas = 1;
  } else {
    if (absl::Status s = daemon.Start(); !s.ok()) return fail(std::string(s.message()));
    say(absl::StrCat("kvdemo: kvcached on ", daemon.address(), "\n"));
    copt.client.address = daemon.address();
    copt.client.shm_socket = (work / "kvcached" / "kvcached.sock").string();
  }
  std::unique_ptr<CacheConnector> cache = CacheConnector::Create(m, copt);
  if (!cache->connected()) return fail(cache->connect_error());

  // The session: system prompt + repository files, then per turn a tool result.
  const std::vector<std::string> files = SourceFiles(source_dir);
  std::vector<uint32_t> context = EncodeBytes(kSystemPrompt);
  size_t next_file = 0;
  while (static_cast<int64_t>(context.size()) < initial_tokens && next_file < files.size() / 2) {
    const std::vector<uint32_t> t = EncodeBytes(files[next_file++]);
    context.insert(context.end(), t.begin(), t.end());
  }
  if (static_cast<int64_t>(context.size()) > initial_tokens) context.resize(initial_tokens);
  // No restart with a cache this program did not start.
  const int restart_after = external_cache.empty() ? turns / 2 : turns + 1;
  const bool show_nodes = nodes > 1 || absl::StartsWith(external_cache, "etcd://");
  nlohmann::json out;
  out["turns"] = nlohmann::json::array();
  say(absl::StrFormat("\n%4s %9s %8s %6s %-7s %10s %10s %8s %s\n", "turn", "context", "reused",
                      "new", "tier", "TTFT warm", "TTFT cold", "speedup",
                      show_nodes ? "served by (node:chunks)" : ""));
  for (int turn = 1; turn <= turns; ++turn) {
    if (turn > 1) {
      // The tool result: the next file, cut to the turn's budget.
      std::string text = absl::StrCat("\n[tool: cat] ", files[next_file++ % files.size()]);
      text.resize(std::min<size_t>(text.size(), static_cast<size_t>(tool_tokens)));
      const std::vector<uint32_t> t = EncodeBytes(text);
      context.insert(context.end(), t.begin(), t.end());
    }
    const bool after_restart = turn == restart_after + 1;
    if (after_restart && rados) {
      // The fleet is lost: every node killed, every data folder deleted; they start empty.
      cache->Drain();
      cache.reset();
      for (int i = 0; i < (nodes > 1 ? nodes : 1); ++i) {
        KvcachedProcess& node = nodes > 1 ? cluster.node(i) : daemon;
        node.Stop(SIGKILL);
        fs::remove_all(nodes > 1 ? work / "cluster" / LocalCluster::NodeId(i) : work / "kvcached");
        if (absl::Status s = node.Start(); !s.ok()) return fail(std::string(s.message()));
        if (nodes > 1) {
          if (absl::Status s = cluster.WaitForNode(i, 10); !s.ok())
            return fail(std::string(s.message()));
        }
      }
      say(absl::StrCat("---- every node killed (SIGKILL) and its data folder deleted; ",
                       nodes > 1 ? "the nodes" : "kvcached",
                       " restarted empty: the session comes from RADOS ----\n"));
      if (nodes == 1) {
        copt.client.address = daemon.address();
        copt.client.shm_socket = (work / "kvcached" / "kvcached.sock").string();
      }
      cache = CacheConnector::Create(m, copt);
      if (!cache->connected()) return fail(cache->connect_error());
    } else if (after_restart && nodes > 1) {
      cluster.node(1).Stop(SIGKILL);
      say(absl::StrCat("---- node ", LocalCluster::NodeId(1),
                       " killed (SIGKILL): its chunks come from their other copy ----\n"));
    } else if (after_restart) {
      cache->Drain();
      cache.reset();
      daemon.Stop(SIGTERM);
      say("---- kvcached restarted (the next day): RAM tier empty, chunks on SSD ----\n");
      if (absl::Status s = daemon.Start(); !s.ok()) return fail(std::string(s.message()));
      copt.client.address = daemon.address();
      cache = CacheConnector::Create(m, copt);
      if (!cache->connected()) return fail(cache->connect_error());
    }
    if (nodes > 1 && !rados && turn == restart_after + 2) {
      if (absl::Status s = cluster.node(1).Start(); !s.ok()) return fail(std::string(s.message()));
      if (absl::Status s = cluster.WaitForNode(1, 10); !s.ok())
        return fail(std::string(s.message()));
      say(absl::StrCat("---- node ", LocalCluster::NodeId(1),
                       " restarted on its folder: it serves its SSD chunks again ----\n"));
    }
    absl::StatusOr<TurnResult> warm = RunTurn(m, *cache, context, generate);
    if (!warm.ok()) return fail(std::string(warm.status().message()));
    cache->Drain();  // the next turn finds this one's chunks
    // The same prompt, cold, for comparison.
    model::Sequence cold = m.NewSequence();
    const auto c0 = Clock::now();
    absl::StatusOr<std::vector<float>> cl = m.Prefill(cold, context, model::PrefillMode::kCed);
    if (!cl.ok()) return fail(std::string(cl.status().message()));
    const double cold_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
    const TurnReport& r = warm->report;
    const bool same_first = model::Argmax(*cl) == model::Argmax(warm->first_logits);
    nlohmann::json tj = TurnJson(*warm);
    tj["turn"] = turn;
    tj["ttft_warm_ms"] = r.ttft_ms;
    tj["ttft_cold_ms"] = cold_ms;
    tj["first_token_matches_cold"] = same_first;
    tj["after_restart"] = after_restart;
    tj["answer"] = DecodeBytes(warm->generated);
    out["turns"].push_back(tj);
    say(absl::StrFormat(
        "%4d %9d %8d %6d %-7s %8.0fms %8.0fms %7.1fx %s\n", turn, r.prompt_tokens, r.reused_tokens,
        r.prompt_tokens - r.reused_tokens, r.tier, r.ttft_ms, cold_ms, cold_ms / r.ttft_ms,
        show_nodes ? r.nodes
        : after_restart
            ? (rados ? "(from RADOS: the node's disk was lost)" : "(from SSD after restart)")
            : ""));
    say(absl::StrCat("     answer: ", AnswerSample(warm->generated, 72), "\n"));
    context.insert(context.end(), warm->generated.begin(), warm->generated.end());
  }
  const int64_t stored = cache->Drain();
  cache.reset();
  daemon.Stop(SIGTERM);
  out["replay"] = replay;
  out["nodes"] = nodes;
  out["rados"] = rados;
  out["chunk_tokens"] = m.layout().chunk_tokens;
  out["chunk_bytes"] = m.layout().chunk_bytes;
  say(absl::StrFormat(
      "\n%d %s stored in the last day's connection; replay %s. TTFT warm includes lookup, "
      "fetch, replay and the new tokens' prefill; cold prefills the whole context.\n",
      stored, show_nodes ? "chunk copies" : "chunks", replay));
  if (json) std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!keep) fs::remove_all(work);
  return 0;
}

}  // namespace
}  // namespace kvc::serve

int main(int argc, char** argv) {
  // Chunks fetched and stored pass through chunk-sized buffers: keep them warm (base/heap.h).
  kvc::KeepLargeBuffersInHeap(kvc::kClientHeap);
  return kvc::serve::Main(argc, argv);
}
