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
//          [--temperature T] [--top-p P] [--seed S] [--greedy]
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
// token ids (engine/spec/byte_tokens.h). The model is the small V4.1 trained in train/ on
// corpus v2 (train/weights/small-v2-plain-22m.safetensors, configs/small.json: 22 M tokens,
// 1.57 bits/byte on the corpus's held-out files and 2.30 on code it never read, and greedy
// answers that no longer loop, docs/quality.md), so each turn
// prints the start of a real continuation; --random-weights runs configs/mini.json with
// random weights instead (answers are noise). The cache, the replay and the timings are
// real either way. Answers are sampled at temperature 0.8 from the top-p 0.95 nucleus with
// seed 1 (turn t draws with seed + t), so they read as the model's text rather than the
// loop greedy decoding falls into; --greedy gives the most likely token each step.
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
#include "base/file.h"
#include "base/heap.h"
#include "base/status_macros.h"
#include "engine/model/generate.h"
#include "engine/model/weights.h"
#include "engine/spec/byte_tokens.h"
#include "nlohmann/json.hpp"
#include "programs/command_line.h"
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

struct Flags {
  int turns = 6, nodes = 1;
  std::string external_cache;
  int64_t tool_tokens = 2048, generate = 128, initial_tokens = 12288;
  std::string replay = "bounded", source_dir, backend = "cpu";
  bool keep = false, json = false, rados = false;
  std::string weights, config;
  bool random_weights = false;
  // Answers are sampled, so they read as text rather than a greedy loop; --greedy is there.
  model::SamplingOptions sampling{.temperature = 0.8, .top_p = 0.95, .seed = 1};
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--turns", f.turns, "turns in the session")
      ->check(CLI::Range(2, 100))
      ->capture_default_str();
  app.add_option("--tool-tokens", f.tool_tokens, "tokens of tool output per turn")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--initial-tokens", f.initial_tokens,
                 "first turn's context: the system prompt and files, cut to this many tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--generate", f.generate, "tokens generated per turn")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  model::AddSamplingFlags(app, f.sampling);
  model::AddReplayFlag(app, f.replay);
  app.add_option("--source-dir", f.source_dir, "repository whose files make up the session");
  CLI::Option* nodes_opt =
      app.add_option("--nodes", f.nodes, "1: one kvcached; N ≥ 2: a cluster of N nodes on etcd")
          ->check(CLI::Range(1, 16))
          ->capture_default_str();
  app.add_option("--cache", f.external_cache,
                 "use this running cache instead (HOST:PORT or etcd://H:P); no restart step")
      ->excludes(nodes_opt);
  app.add_flag(
         "--rados", f.rados,
         "a single-host Ceph cluster as the shared tier below every node (scripts/ceph-up.sh; "
         "Ceph from scripts/install-deps.sh); halfway every node is killed and its folder "
         "deleted, and the session resumes from RADOS")
      ->excludes("--cache");
  model::AddBackendFlag(app, f.backend);
  app.add_flag("--keep", f.keep, "keep the scratch folder (weights, kvcached data and log)");
  app.add_option(
      "--weights", f.weights,
      "trained weights (default: SOURCE_DIR/train/weights/small-v2-plain-22m.safetensors)");
  app.add_option("--config", f.config, "their config (default: SOURCE_DIR/configs/small.json)");
  app.add_flag("--random-weights", f.random_weights,
               "configs/mini.json with random weights (seed 1) instead of a trained model");
  app.add_flag("--json", f.json, "print one JSON object");
}

// The demo's parts, built in steps: the model, the cache (one kvcached, a cluster, Ceph
// below, or a running cache), then the session's turns with their disruption halfway.
class Demo {
 public:
  Demo(Flags f, fs::path work) : f_(std::move(f)), work_(std::move(work)) {}

  absl::Status LoadModel();
  absl::Status StartCache();
  absl::Status RunSession();

  void Say(const std::string& m) const {
    if (!f_.json) std::cout << m << std::flush;
  }

 private:
  absl::Status Connect();
  // Before the turn after the halfway point: the restart, node kill or fleet loss.
  absl::Status Disrupt(int turn);
  absl::Status Turn(int turn, std::vector<uint32_t>& context, nlohmann::json& out);
  bool cluster() const { return f_.nodes > 1; }
  bool show_nodes() const { return cluster() || absl::StartsWith(f_.external_cache, "etcd://"); }

  const Flags f_;
  const fs::path work_;
  const fs::path bin_ = fs::read_symlink("/proc/self/exe").parent_path();
  std::string config_text_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<LocalCeph> ceph_;  // ended with the demo, however it ends
  std::unique_ptr<KvcachedProcess> daemon_;
  std::unique_ptr<LocalCluster> cluster_;
  ConnectorOptions copt_;
  std::unique_ptr<CacheConnector> cache_;
  int restart_after_ = 0;
};

// The shipped trained model unless asked otherwise (or missing), else mini with random weights.
absl::Status Demo::LoadModel() {
  const std::string weights_opt =
      f_.weights.empty() ? f_.source_dir + "/train/weights/small-v2-plain-22m.safetensors"
                         : f_.weights;
  const std::string config_opt =
      f_.config.empty() ? f_.source_dir + "/configs/small.json" : f_.config;
  bool trained = !f_.random_weights;
  if (trained && !fs::exists(weights_opt)) {
    if (!f_.weights.empty())
      return absl::NotFoundError(absl::StrCat("--weights ", weights_opt, " does not exist"));
    Say(absl::StrCat("kvdemo: no trained weights at ", weights_opt, "; random weights instead\n"));
    trained = false;
  }
  config_text_ = kEmbeddedMiniConfig;
  std::string config_name = "configs/mini.json";
  if (trained) {
    KVC_ASSIGN_OR_RETURN(config_text_, ReadFile(config_opt));
    config_name = config_opt;
  }
  KVC_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(config_text_, config_name));
  if (!HoldsByteTokens(config.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_name, ": its vocabulary does not hold the byte tokens"));
  }
  KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(config));
  std::string weights = weights_opt;
  if (!trained) {
    weights = (work_ / "mini.safetensors").string();
    KVC_RETURN_IF_ERROR(model::WriteRandomWeights(config, schedule, 1, weights));
  }
  model::ModelOptions options;
  KVC_RETURN_IF_ERROR(model::SelectBackends(f_.backend, f_.replay == "exact", options));
  KVC_ASSIGN_OR_RETURN(model_, model::Model::Load(config, weights, std::move(options)));
  copt_.model_id = trained ? fs::path(weights).stem().string() : "mini-seed1";
  Say(absl::StrFormat(
      "kvdemo: %s model (%d layers, %d-token window, %.0f B/token of global KV, %d-token "
      "chunks), %s; scratch folder %s\n",
      trained ? "small" : "mini", config.num_hidden_layers, config.sliding_window,
      model_->layout().bytes_per_token(), model_->layout().chunk_tokens,
      trained ? absl::StrCat("trained weights ", weights) : std::string("random weights"),
      work_.string()));
  return absl::OkStatus();
}

absl::Status Demo::StartCache() {
  std::vector<std::string> capacity = {"--ram-bytes", "268435456", "--ssd-bytes", "1073741824"};
  if (f_.rados) {
    Say("kvdemo: starting a single-host Ceph cluster (one monitor, one memstore OSD)\n");
    KVC_ASSIGN_OR_RETURN(ceph_,
                         LocalCeph::Start(f_.source_dir, (work_ / "ceph").string(), "kvcache"));
    const std::vector<std::string> shared = ceph_->KvcachedFlags();
    capacity.insert(capacity.end(), shared.begin(), shared.end());
  }
  daemon_ = std::make_unique<KvcachedProcess>((bin_ / "kvcached").string(),
                                              (work_ / "kvcached").string(), capacity);
  std::vector<std::string> node_flags = capacity;
  node_flags.insert(node_flags.end(), {"--cluster-lease-seconds", "2"});
  // Under RADOS one copy on the nodes is enough: RADOS holds the durable one (R = 1).
  if (f_.rados) node_flags.insert(node_flags.end(), {"--replicas", "1"});
  cluster_ = std::make_unique<LocalCluster>((bin_ / "kvcached").string(),
                                            (work_ / "cluster").string(), f_.nodes, node_flags);
  copt_.model_config_json = config_text_;
  copt_.replay = f_.replay == "exact" ? model::ReplayMode::kExact : model::ReplayMode::kBounded;
  // On the GPU the chunks a co-located kvcached holds in HBM come out over CUDA IPC.
  if (f_.backend != "cpu") copt_.hbm_reader = model::MakeHbmChunkReader();
  if (!f_.external_cache.empty()) {
    Say(absl::StrCat("kvdemo: the cache at ", f_.external_cache, "\n"));
    copt_.client.address = f_.external_cache;
  } else if (cluster()) {
    std::filesystem::create_directories(work_ / "cluster");
    KVC_RETURN_IF_ERROR(cluster_->Start());
    Say(absl::StrCat("kvdemo: etcd and ", f_.nodes, " kvcached nodes (", cluster_->url(),
                     "), each chunk on ", f_.rados ? "1 of them and in RADOS" : "2 of them", "\n"));
    copt_.client.address = cluster_->url();
    if (f_.rados) copt_.client.replicas = 1;
  } else {
    KVC_RETURN_IF_ERROR(daemon_->Start());
    Say(absl::StrCat("kvdemo: kvcached on ", daemon_->address(), "\n"));
    copt_.client.address = daemon_->address();
    copt_.client.shm_socket = (work_ / "kvcached" / "kvcached.sock").string();
  }
  return Connect();
}

absl::Status Demo::Connect() {
  cache_ = CacheConnector::Create(*model_, copt_);
  if (!cache_->connected()) return absl::UnavailableError(cache_->connect_error());
  return absl::OkStatus();
}

absl::Status Demo::Disrupt(int turn) {
  if (turn == restart_after_ + 1 && f_.rados) {
    // The fleet is lost: every node killed, every data folder deleted; they start empty.
    cache_->Drain();
    cache_.reset();
    for (int i = 0; i < (cluster() ? f_.nodes : 1); ++i) {
      KvcachedProcess& node = cluster() ? cluster_->node(i) : *daemon_;
      node.Stop(SIGKILL);
      fs::remove_all(cluster() ? work_ / "cluster" / LocalCluster::NodeId(i) : work_ / "kvcached");
      KVC_RETURN_IF_ERROR(node.Start());
      if (cluster()) KVC_RETURN_IF_ERROR(cluster_->WaitForNode(i, 10));
    }
    Say(absl::StrCat("---- every node killed (SIGKILL) and its data folder deleted; ",
                     cluster() ? "the nodes" : "kvcached",
                     " restarted empty: the session comes from RADOS ----\n"));
    if (!cluster()) {
      copt_.client.address = daemon_->address();
      copt_.client.shm_socket = (work_ / "kvcached" / "kvcached.sock").string();
    }
    return Connect();
  }
  if (turn == restart_after_ + 1 && cluster()) {
    cluster_->node(1).Stop(SIGKILL);
    Say(absl::StrCat("---- node ", LocalCluster::NodeId(1),
                     " killed (SIGKILL): its chunks come from their other copy ----\n"));
    return absl::OkStatus();
  }
  if (turn == restart_after_ + 1) {
    cache_->Drain();
    cache_.reset();
    daemon_->Stop(SIGTERM);
    Say("---- kvcached restarted (the next day): RAM tier empty, chunks on SSD ----\n");
    KVC_RETURN_IF_ERROR(daemon_->Start());
    copt_.client.address = daemon_->address();
    return Connect();
  }
  if (cluster() && !f_.rados && turn == restart_after_ + 2) {
    KVC_RETURN_IF_ERROR(cluster_->node(1).Start());
    KVC_RETURN_IF_ERROR(cluster_->WaitForNode(1, 10));
    Say(absl::StrCat("---- node ", LocalCluster::NodeId(1),
                     " restarted on its folder: it serves its SSD chunks again ----\n"));
  }
  return absl::OkStatus();
}

// One turn: resumed from the cache, then the same prompt cold for the TTFT comparison; the
// answer joins the context.
absl::Status Demo::Turn(int turn, std::vector<uint32_t>& context, nlohmann::json& out) {
  const model::Model& m = *model_;
  const bool after_restart = turn == restart_after_ + 1;
  model::SamplingOptions sampling = f_.sampling;
  sampling.seed += static_cast<uint64_t>(turn);  // each turn its own stream, all from --seed
  KVC_ASSIGN_OR_RETURN(TurnResult warm, RunTurn(m, *cache_, context, f_.generate, sampling));
  cache_->Drain();  // the next turn finds this one's chunks
  model::Sequence cold = m.NewSequence();
  const auto c0 = Clock::now();
  KVC_ASSIGN_OR_RETURN(std::vector<float> cl, m.Prefill(cold, context, model::PrefillMode::kCed));
  const double cold_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
  const TurnReport& r = warm.report;
  nlohmann::json tj = TurnJson(warm);
  tj["turn"] = turn;
  tj["ttft_warm_ms"] = r.ttft_ms;
  tj["ttft_cold_ms"] = cold_ms;
  tj["first_token_matches_cold"] = model::Argmax(cl) == model::Argmax(warm.first_logits);
  tj["after_restart"] = after_restart;
  tj["answer"] = DecodeBytes(warm.generated);
  out["turns"].push_back(tj);
  Say(absl::StrFormat(
      "%4d %9d %8d %6d %-7s %8.0fms %8.0fms %7.1fx %s\n", turn, r.prompt_tokens, r.reused_tokens,
      r.prompt_tokens - r.reused_tokens, r.tier, r.ttft_ms, cold_ms, cold_ms / r.ttft_ms,
      show_nodes() ? r.nodes
      : after_restart
          ? (f_.rados ? "(from RADOS: the node's disk was lost)" : "(from SSD after restart)")
          : ""));
  Say(absl::StrCat("     answer: ", AnswerSample(warm.generated, 72), "\n"));
  context.insert(context.end(), warm.generated.begin(), warm.generated.end());
  return absl::OkStatus();
}

// The session: system prompt + repository files, then per turn a tool result (the next
// file, cut to the turn's budget) and the model's answer.
absl::Status Demo::RunSession() {
  const std::vector<std::string> files = SourceFiles(f_.source_dir);
  std::vector<uint32_t> context = EncodeBytes(kSystemPrompt);
  size_t next_file = 0;
  while (static_cast<int64_t>(context.size()) < f_.initial_tokens && next_file < files.size() / 2) {
    const std::vector<uint32_t> t = EncodeBytes(files[next_file++]);
    context.insert(context.end(), t.begin(), t.end());
  }
  if (static_cast<int64_t>(context.size()) > f_.initial_tokens) context.resize(f_.initial_tokens);
  // No restart with a cache this program did not start.
  restart_after_ = f_.external_cache.empty() ? f_.turns / 2 : f_.turns + 1;
  nlohmann::json out;
  out["turns"] = nlohmann::json::array();
  Say(absl::StrFormat("\n%4s %9s %8s %6s %-7s %10s %10s %8s %s\n", "turn", "context", "reused",
                      "new", "tier", "TTFT warm", "TTFT cold", "speedup",
                      show_nodes() ? "served by (node:chunks)" : ""));
  for (int turn = 1; turn <= f_.turns; ++turn) {
    if (turn > 1) {
      std::string text = absl::StrCat("\n[tool: cat] ", files[next_file++ % files.size()]);
      text.resize(std::min<size_t>(text.size(), static_cast<size_t>(f_.tool_tokens)));
      const std::vector<uint32_t> t = EncodeBytes(text);
      context.insert(context.end(), t.begin(), t.end());
    }
    KVC_RETURN_IF_ERROR(Disrupt(turn));
    KVC_RETURN_IF_ERROR(Turn(turn, context, out));
  }
  const int64_t stored = cache_->Drain();
  cache_.reset();
  daemon_->Stop(SIGTERM);
  out["replay"] = f_.replay;
  out["nodes"] = f_.nodes;
  out["rados"] = f_.rados;
  out["sampling"] = {{"temperature", f_.sampling.temperature},
                     {"top_p", f_.sampling.top_p},
                     {"seed", f_.sampling.seed}};
  out["chunk_tokens"] = model_->layout().chunk_tokens;
  out["chunk_bytes"] = model_->layout().chunk_bytes;
  Say(absl::StrFormat(
      "\n%d %s stored in the last day's connection; replay %s; answers %s. TTFT warm includes "
      "lookup, fetch, replay and the new tokens' prefill; cold prefills the whole context.\n",
      stored, show_nodes() ? "chunk copies" : "chunks", f_.replay,
      f_.sampling.greedy()
          ? std::string("greedy")
          : absl::StrFormat("sampled at temperature %g, top-p %g, seed %d", f_.sampling.temperature,
                            f_.sampling.top_p, f_.sampling.seed)));
  if (f_.json)
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"kvdemo: a multi-day coding-agent session resumed from kvcached"};
  Flags f;
  AddFlags(app, f);
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvdemo")) return *stop;
  if (f.source_dir.empty()) f.source_dir = KVC_SOURCE_DIR;
  char tmpl[] = "/tmp/kvdemo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::cerr << "kvdemo: error: cannot create a scratch folder in /tmp\n";
    return 1;
  }
  const fs::path work = tmpl;
  const bool keep = f.keep;
  absl::Status s;
  {
    Demo demo(std::move(f), work);  // its processes end before the folder goes
    s = demo.LoadModel();
    if (s.ok()) s = demo.StartCache();
    if (s.ok()) s = demo.RunSession();
  }
  if (!s.ok()) std::cerr << "kvdemo: error: " << s.message() << "\n";
  if (!keep) fs::remove_all(work);
  return s.ok() ? 0 : 1;
}

}  // namespace
}  // namespace kvc::serve

int main(int argc, char** argv) {
  // Chunks fetched and stored pass through chunk-sized buffers: keep them warm (base/heap.h).
  kvc::KeepLargeBuffersInHeap(kvc::kClientHeap);
  return kvc::serve::Main(argc, argv);
}
