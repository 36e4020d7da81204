// kvserve: one turn of a named agent session per invocation, resumed from kvcached.
//
//   kvserve --cache HOST:PORT --config C --weights W --state-dir DIR --session ID
//           (--text "..." | --tokens-file F) [--max-new-tokens N] [--replay bounded|exact]
//           [--shm-socket PATH] [--auth-token T] [--json]
//
// The session's token history lives in DIR/ID.tokens; each call appends the turn's new
// tokens (text through the byte-level tokenizer, or ids from a file), resumes from what
// kvcached holds of the history, generates, stores the new chunks, appends the answer and
// reports: reused tokens and their tier, tokens prefilled and replayed, time to first
// token, decode tokens/s. A process per turn is the multi-day case: nothing survives
// between turns but the history file and the cache.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/program_flags.h"
#include "backends/select.h"
#include "base/heap.h"
#include "base/status_macros.h"
#include "engine/spec/byte_tokens.h"
#include "nlohmann/json.hpp"
#include "programs/command_line.h"
#include "serve/session.h"

namespace kvc::serve {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::vector<uint32_t>> ReadIds(const std::string& path, bool missing_ok) {
  std::ifstream in(path);
  if (!in) {
    if (missing_ok) return std::vector<uint32_t>{};
    return absl::NotFoundError(absl::StrCat("cannot open \"", path, "\""));
  }
  std::vector<uint32_t> ids;
  std::string w;
  while (in >> w) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(w.c_str(), &end, 10);
    if (*end != '\0' || w[0] == '-' || v > 0xFFFFFFFFull) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", path, "\": token ", ids.size(), " is \"", w, "\", not a token id"));
    }
    ids.push_back(static_cast<uint32_t>(v));
  }
  return ids;
}

absl::Status Run(const std::string& cache, const std::string& config_path,
                 const std::string& weights, const std::string& state_dir,
                 const std::string& session, const std::string& text,
                 const std::string& tokens_file, int64_t max_new, const std::string& replay,
                 const std::string& shm_socket, const std::string& token,
                 const std::string& backend, bool json) {
  if (session.empty() || session.find('/') != std::string::npos || session[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("--session \"", session, "\" must be a plain name (no '/')"));
  }
  std::ifstream cin(config_path);
  if (!cin)
    return absl::NotFoundError(absl::StrCat("cannot open model config \"", config_path, "\""));
  std::stringstream config_text;
  config_text << cin.rdbuf();
  KVC_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(config_text.str(), config_path));
  model::ModelOptions options;
  KVC_RETURN_IF_ERROR(model::SelectBackends(backend, replay == "exact", options));
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> loaded,
                       model::Model::Load(config, weights, std::move(options)));
  const model::Model& m = *loaded;

  fs::create_directories(state_dir);
  const std::string history_path = (fs::path(state_dir) / (session + ".tokens")).string();
  KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> history, ReadIds(history_path, true));
  std::vector<uint32_t> fresh;
  if (!tokens_file.empty()) {
    KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> t, ReadIds(tokens_file, false));
    fresh = t;
  } else {
    fresh = EncodeBytes(text);
  }
  if (fresh.empty()) return absl::InvalidArgumentError("the turn has no new tokens");
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (fresh[i] >= static_cast<uint32_t>(config.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "new token ", i, " is ", fresh[i], ", outside the vocabulary of ", config.vocab_size));
    }
  }
  std::vector<uint32_t> context = history;
  context.insert(context.end(), fresh.begin(), fresh.end());

  ConnectorOptions o;
  o.client.address = cache;
  o.client.bearer_token = token;
  o.client.shm_socket = shm_socket;
  o.model_config_json = config_text.str();
  o.model_id = fs::path(weights).filename().string();
  o.replay = replay == "exact" ? model::ReplayMode::kExact : model::ReplayMode::kBounded;
  // On the GPU the chunks a co-located kvcached holds in HBM come out over CUDA IPC.
  if (backend != "cpu") o.hbm_reader = model::MakeHbmChunkReader();
  std::unique_ptr<CacheConnector> connector = CacheConnector::Create(m, o);
  KVC_ASSIGN_OR_RETURN(TurnResult turn, RunTurn(m, *connector, context, max_new));
  const int64_t stored = connector->Drain();
  context.insert(context.end(), turn.generated.begin(), turn.generated.end());
  {
    const std::string tmp = history_path + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    for (size_t i = 0; i < context.size(); ++i) out << context[i] << (i % 32 == 31 ? "\n" : " ");
    out.close();
    if (!out) return absl::DataLossError(absl::StrCat("cannot write \"", tmp, "\""));
    fs::rename(tmp, history_path);
  }
  const TurnReport& r = turn.report;
  nlohmann::json j = TurnJson(turn);
  j["session"] = session;
  j["stored_chunks"] = stored;
  j["generated"] = turn.generated;
  if (tokens_file.empty()) j["text"] = DecodeBytes(turn.generated);
  if (json) {
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << absl::StrFormat(
        "session %s: %d context tokens, %d reused from %s, %d replayed, TTFT %.0f ms, "
        "%.1f tok/s, %d chunks stored\n",
        session, r.prompt_tokens, r.reused_tokens, r.tier, r.replayed_tokens, r.ttft_ms,
        turn.decode_tok_s, stored);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"kvserve: one turn of an agent session, resumed from kvcached"};
  std::string cache = "127.0.0.1:50051", config, weights, state_dir = "kvserve-sessions", session,
              text, tokens_file, replay = "bounded", shm_socket, token, backend = "cpu";
  int64_t max_new = 64;
  bool json = false;
  app.add_option("--cache", cache, "kvcached address (HOST:PORT), or a cluster (etcd://H:P[,H:P…])")
      ->capture_default_str();
  app.add_option("--config", config, "model config.json")->required();
  app.add_option("--weights", weights, "safetensors weights")->required();
  app.add_option("--state-dir", state_dir, "where session histories live")->capture_default_str();
  app.add_option("--session", session, "session id")->required();
  auto* t = app.add_option("--text", text, "the turn's new text (byte-level tokens)");
  app.add_option("--tokens-file", tokens_file, "the turn's new token ids")->excludes(t);
  app.add_option("--max-new-tokens", max_new, "tokens to generate")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  model::AddReplayFlag(app, replay);
  app.add_option("--shm-socket", shm_socket, "kvcached's arena socket (co-located)");
  app.add_option("--auth-token", token, "bearer token");
  model::AddBackendFlag(app, backend);
  app.add_flag("--json", json, "print one JSON object");
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvserve")) return *stop;
  if (text.empty() && tokens_file.empty()) {
    std::cerr << "kvserve: error: give the turn's input with --text or --tokens-file\n";
    return 2;
  }
  absl::Status s = Run(cache, config, weights, state_dir, session, text, tokens_file, max_new,
                       replay, shm_socket, token, backend, json);
  if (!s.ok()) {
    std::cerr << "kvserve: error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc::serve

int main(int argc, char** argv) {
  // Chunks fetched and stored pass through chunk-sized buffers: keep them warm (base/heap.h).
  kvc::KeepLargeBuffersInHeap(kvc::kClientHeap);
  return kvc::serve::Main(argc, argv);
}
