// kvgen: runs the engine on a prompt and prints one JSON object.
//
//   kvgen --config C --weights W (--prompt FILE | --text-file TEXT) --max-new-tokens N
//         [--greedy | --temperature T --top-p P --seed S]
//         [--resume-at P --replay exact|bounded|full] [--no-ced] [--chunk-tokens C]
//         [--dspark] [--dump-logits FILE] [--backend cpu|cuda|cublas] --json
//
// FILE holds token ids separated by whitespace; TEXT is any text, tokenized with the byte
// tokens of the models train/ makes (engine/spec/byte_tokens.h), and the output then also
// holds the decoded continuation ("text"). Tokens are sampled at --temperature (default 1)
// from the --top-p nucleus (default 1: every token) with --seed, or with --greedy the most
// likely each step (engine/model/generate.h). With --resume-at P, kvgen runs a cold
// prefill of the first P tokens, takes their pages (P / chunk_tokens whole chunks), starts
// a fresh sequence, imports the pages and resumes on the whole prompt with the replay
// mode (`full`: ignore the pages and prefill everything at full depth, the reference).
// Output: generated, prefill_tokens_computed {encoder, decoder}, replayed_tokens,
// ttft_ms (of the run that produces the first token: the resume when resuming),
// decode_tok_s; with --dspark also the acceptance and first_draft (the drafter's block
// right after the prompt). --dump-logits writes float32 logits (vocab_size each, little-endian) of
// the prompt's last position and then of every generated position. --backend cuda runs
// the matrix products on the GPU (same bits as the CPU); cublas through cuBLAS (faster,
// not batch invariant: no exact replay). Both need a build with the CUDA backend.
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "backends/program_flags.h"
#include "backends/select.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "engine/model/generate.h"
#include "engine/model/model.h"
#include "engine/spec/byte_tokens.h"
#include "engine/spec/model_config.h"
#include "nlohmann/json.hpp"
#include "programs/command_line.h"

static_assert(std::endian::native == std::endian::little, "logit dumps are little-endian");

namespace kvc {
namespace {

using Clock = std::chrono::steady_clock;

// The prompt as byte tokens of the text in `path`.
absl::StatusOr<std::vector<uint32_t>> ReadText(const std::string& path, int64_t vocab_size) {
  if (!HoldsByteTokens(vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text-file needs a vocabulary of byte tokens (at least ",
                     kFirstByteToken + kByteTokens, " ids); this config has ", vocab_size));
  }
  KVC_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  if (text.empty())
    return absl::InvalidArgumentError(absl::StrCat("text file \"", path, "\" is empty"));
  return EncodeBytes(text);
}

absl::StatusOr<std::vector<uint32_t>> ReadTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open prompt file \"", path, "\""));
  std::vector<uint32_t> tokens;
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
    if (word.empty() || *end != '\0' || word[0] == '-' || errno != 0 || v > 0xFFFFFFFFull) {
      return absl::InvalidArgumentError(absl::StrCat("prompt file \"", path, "\": token ",
                                                     tokens.size(), " is \"", word,
                                                     "\", not a token id"));
    }
    tokens.push_back(static_cast<uint32_t>(v));
  }
  if (tokens.empty())
    return absl::InvalidArgumentError(absl::StrCat("prompt file \"", path, "\" is empty"));
  return tokens;
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Flags {
  std::string config_path, weights_path, prompt_path, text_path, replay = "exact", dump_path,
                                                                 backend = "cpu";
  int64_t max_new = 16, resume_at = 0, chunk_tokens = 256;
  // kvgen samples at temperature 1 over every token unless told otherwise.
  model::SamplingOptions sampling{.temperature = 1.0};
  bool no_ced = false, json = false, dspark = false;
  bool text_prompt() const { return !text_path.empty(); }
};

absl::StatusOr<std::vector<uint32_t>> LoadPrompt(const Flags& f, int64_t vocab_size) {
  KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> prompt, f.text_prompt()
                                                         ? ReadText(f.text_path, vocab_size)
                                                         : ReadTokens(f.prompt_path));
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= static_cast<uint32_t>(vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                     ", outside the vocabulary of ", vocab_size));
    }
  }
  return prompt;
}

// The prompt's last logits: a prefill, or with --resume-at a cold prefill of the first P
// tokens whose pages a fresh sequence resumes from. `ttft_ms` times the run that gives them.
absl::StatusOr<std::vector<float>> PrefillOrResume(const Flags& f, const model::Model& m,
                                                   std::span<const uint32_t> prompt,
                                                   model::Sequence& seq, nlohmann::json& out,
                                                   double& ttft_ms) {
  const model::PrefillMode mode =
      f.no_ced ? model::PrefillMode::kFullDepth : model::PrefillMode::kCed;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (f.resume_at == 0) {
    const auto t0 = Clock::now();
    absl::StatusOr<std::vector<float>> logits = m.Prefill(seq, prompt, mode);
    ttft_ms = Ms(t0, Clock::now());
    return logits;
  }
  const int64_t C = m.layout().chunk_tokens;
  if (f.resume_at % C != 0 || f.resume_at >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume-at ", f.resume_at, " must be a multiple of the chunk size ", C,
                     " and shorter than the prompt (", n, " tokens)"));
  }
  if (f.replay != "exact" && f.replay != "bounded" && f.replay != "full") {
    return absl::InvalidArgumentError(
        absl::StrCat("--replay is \"", f.replay, "\"; use exact, bounded or full"));
  }
  const auto c0 = Clock::now();
  model::Sequence prefix = m.NewSequence();
  KVC_ASSIGN_OR_RETURN(std::vector<float> warm, m.Prefill(prefix, prompt.first(f.resume_at), mode));
  std::vector<uint8_t> pages;
  for (int64_t c = 0; c < f.resume_at / C; ++c) {
    std::span<const uint8_t> p = prefix.page(c);
    pages.insert(pages.end(), p.begin(), p.end());
  }
  out["cold_prefix_ms"] = Ms(c0, Clock::now());
  out["cached_tokens"] = f.resume_at;
  out["replay"] = f.replay;
  const auto t0 = Clock::now();
  absl::StatusOr<std::vector<float>> logits =
      f.replay == "full"
          ? m.Prefill(seq, prompt, model::PrefillMode::kFullDepth)
          : m.Resume(seq, pages, f.resume_at, prompt,
                     f.replay == "exact" ? model::ReplayMode::kExact : model::ReplayMode::kBounded);
  ttft_ms = Ms(t0, Clock::now());
  return logits;
}

// Greedy (plain or DSpark) or sampled generation; the drafter's figures go to `out`.
absl::StatusOr<model::Generation> GenerateTokens(const Flags& f, const model::Model& m,
                                                 model::Sequence& seq, std::vector<float> logits,
                                                 nlohmann::json& out) {
  if (!f.dspark) return model::Generate(m, seq, std::move(logits), f.max_new, f.sampling);
  // The drafter's first block after the prompt, as proposed (train/'s tests hold the
  // PyTorch drafter to it).
  KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> first, m.Draft(seq, model::Argmax(logits)));
  out["first_draft"] = first;
  KVC_ASSIGN_OR_RETURN(model::Generation g,
                       model::GenerateGreedy(m, seq, std::move(logits), f.max_new, true));
  out["dspark"] = {{"drafted", g.drafted},
                   {"accepted", g.accepted},
                   {"acceptance", g.acceptance()},
                   {"main_passes", g.main_passes}};
  return g;
}

absl::Status Run(const Flags& f) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(f.config_path));
  model::ModelOptions options;
  options.chunk_tokens = f.chunk_tokens;
  KVC_RETURN_IF_ERROR(
      model::SelectBackends(f.backend, f.resume_at > 0 && f.replay == "exact", options));
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> loaded,
                       model::Model::Load(config, f.weights_path, std::move(options)));
  const model::Model& m = *loaded;
  KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> prompt, LoadPrompt(f, config.vocab_size));
  std::ofstream dump;
  if (!f.dump_path.empty()) {
    dump.open(f.dump_path, std::ios::binary | std::ios::trunc);
    if (!dump)
      return absl::PermissionDeniedError(absl::StrCat("cannot write \"", f.dump_path, "\""));
  }
  nlohmann::json out;
  out["backend"] = m.matmul_backend();
  out["attention_backend"] = m.attention_backend();
  out["indexer_backend"] = m.indexer_backend();
  model::Sequence seq = m.NewSequence();
  double ttft = 0;
  KVC_ASSIGN_OR_RETURN(std::vector<float> logits, PrefillOrResume(f, m, prompt, seq, out, ttft));
  const model::ForwardStats stats = seq.last_stats();
  const auto d0 = Clock::now();
  KVC_ASSIGN_OR_RETURN(model::Generation g, GenerateTokens(f, m, seq, std::move(logits), out));
  const double decode_s = std::chrono::duration<double>(Clock::now() - d0).count();
  for (const std::vector<float>& l : g.logits) {
    if (dump.is_open()) {
      dump.write(reinterpret_cast<const char*>(l.data()),
                 static_cast<std::streamsize>(l.size() * sizeof(float)));
    }
  }
  out["prompt_tokens"] = prompt.size();
  out["generated"] = g.tokens;
  if (f.text_prompt()) out["text"] = DecodeBytes(g.tokens);
  out["sampling"] = {{"temperature", f.sampling.temperature},
                     {"top_p", f.sampling.top_p},
                     {"seed", f.sampling.seed}};
  out["prefill_tokens_computed"] = {{"encoder", stats.encoder_tokens},
                                    {"decoder", stats.decoder_tokens},
                                    {"decoder_compressor", stats.compressed_tokens}};
  out["replayed_tokens"] = stats.replayed_tokens;
  out["ced"] = !f.no_ced;
  out["ttft_ms"] = ttft;
  out["decode_tok_s"] = g.tokens.size() > 1 && decode_s > 0
                            ? static_cast<double>(g.tokens.size() - 1) / decode_s
                            : 0.0;
  // A continuation cut mid-character is not UTF-8: such bytes print as U+FFFD.
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return absl::OkStatus();
}

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--config", f.config_path, "model config.json")->required();
  app.add_option("--weights", f.weights_path, "safetensors weights")->required();
  CLI::Option_group* prompts = app.add_option_group("prompt", "one of --prompt, --text-file");
  prompts->add_option("--prompt", f.prompt_path, "file of whitespace-separated token ids");
  prompts->add_option("--text-file", f.text_path,
                      "a text prompt, in byte tokens (models trained by train/)");
  prompts->require_option(1);
  app.add_option("--max-new-tokens", f.max_new, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  model::AddSamplingFlags(app, f.sampling);
  app.add_option("--resume-at", f.resume_at, "resume from the pages of the first P tokens")
      ->check(CLI::PositiveNumber);
  app.add_option("--replay", f.replay, "exact, bounded or full (with --resume-at)");
  app.add_flag("--no-ced", f.no_ced, "prefill every layer over every token");
  app.add_flag("--dspark", f.dspark, "speculative decoding with the DSpark drafter");
  app.add_option("--chunk-tokens", f.chunk_tokens, "tokens per page")->check(CLI::PositiveNumber);
  app.add_option("--dump-logits", f.dump_path, "write raw float32 logits of every step");
  model::AddBackendFlag(app, f.backend);
  app.add_flag("--json", f.json, "print one JSON object (the only output format)");
}

int Main(int argc, char** argv) {
  CLI::App app{"kvgen: run the kvcache engine on a prompt"};
  Flags f;
  AddFlags(app, f);
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvgen")) return *stop;
  if (f.dspark && !f.sampling.greedy()) {
    std::cerr << "kvgen: error: --dspark needs --greedy (speculative sampling is greedy here)\n";
    return 2;
  }
  absl::Status s = Run(f);
  if (!s.ok()) {
    std::cerr << "kvgen: error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) { return kvc::Main(argc, argv); }
