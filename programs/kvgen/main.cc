// kvgen: runs the engine on a prompt and prints one JSON object.
//
//   kvgen --config C --weights W (--prompt FILE | --text-file TEXT) --max-new-tokens N [--greedy]
//   [--seed S]
//         [--resume-at P --replay exact|bounded|full] [--no-ced] [--chunk-tokens C]
//         [--dspark] [--dump-logits FILE] [--backend cpu|cuda|cublas] --json
//
// FILE holds token ids separated by whitespace; TEXT is any text, tokenized with the byte
// tokens of the models train/ makes (engine/spec/byte_tokens.h), and the output then also
// holds the decoded continuation ("text"). With --resume-at P, kvgen runs a cold
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

// Greedy: the highest logit, ties to the lower id. Otherwise Gumbel-max at temperature 1.
uint32_t Sample(const std::vector<float>& logits, bool greedy, uint64_t& rng) {
  size_t best = 0;
  double best_v = -INFINITY;
  for (size_t i = 0; i < logits.size(); ++i) {
    double v = logits[i];
    if (!greedy) {
      uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const double u = (static_cast<double>(z >> 11) + 0.5) * 0x1.0p-53;
      v -= std::log(-std::log(u));
    }
    if (v > best_v) {
      best_v = v;
      best = i;
    }
  }
  return static_cast<uint32_t>(best);
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

absl::Status Run(const std::string& config_path, const std::string& weights_path,
                 const std::string& prompt_path, bool text_prompt, int64_t max_new, bool greedy,
                 uint64_t seed, int64_t resume_at, const std::string& replay, bool no_ced,
                 int64_t chunk_tokens, const std::string& dump_path, bool dspark,
                 const std::string& backend) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(config_path));
  model::ModelOptions options;
  options.chunk_tokens = chunk_tokens;
  KVC_RETURN_IF_ERROR(model::SelectBackends(backend, resume_at > 0 && replay == "exact", options));
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> loaded,
                       model::Model::Load(config, weights_path, std::move(options)));
  const model::Model& m = *loaded;
  KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> prompt, text_prompt
                                                         ? ReadText(prompt_path, config.vocab_size)
                                                         : ReadTokens(prompt_path));
  for (size_t i = 0; i < prompt.size(); ++i) {
    if ((prompt)[i] >= static_cast<uint32_t>(config.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", (prompt)[i],
                                                     ", outside the vocabulary of ",
                                                     config.vocab_size));
    }
  }
  const int64_t n = static_cast<int64_t>(prompt.size());
  const model::PrefillMode mode =
      no_ced ? model::PrefillMode::kFullDepth : model::PrefillMode::kCed;
  std::ofstream dump;
  if (!dump_path.empty()) {
    dump.open(dump_path, std::ios::binary | std::ios::trunc);
    if (!dump) return absl::PermissionDeniedError(absl::StrCat("cannot write \"", dump_path, "\""));
  }
  nlohmann::json out;
  out["backend"] = m.matmul_backend();
  out["attention_backend"] = m.attention_backend();
  out["indexer_backend"] = m.indexer_backend();
  model::Sequence seq = m.NewSequence();
  absl::StatusOr<std::vector<float>> logits;
  Clock::time_point t0;
  if (resume_at > 0) {
    const int64_t C = m.layout().chunk_tokens;
    if (resume_at % C != 0 || resume_at >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("--resume-at ", resume_at, " must be a multiple of the chunk size ", C,
                       " and shorter than the prompt (", n, " tokens)"));
    }
    if (replay != "exact" && replay != "bounded" && replay != "full") {
      return absl::InvalidArgumentError(
          absl::StrCat("--replay is \"", replay, "\"; use exact, bounded or full"));
    }
    const auto c0 = Clock::now();
    model::Sequence prefix = m.NewSequence();
    KVC_ASSIGN_OR_RETURN(std::vector<float> warm,
                         m.Prefill(prefix, std::span(prompt).first(resume_at), mode));
    std::vector<uint8_t> pages;
    for (int64_t c = 0; c < resume_at / C; ++c) {
      std::span<const uint8_t> p = prefix.page(c);
      pages.insert(pages.end(), p.begin(), p.end());
    }
    out["cold_prefix_ms"] = Ms(c0, Clock::now());
    out["cached_tokens"] = resume_at;
    out["replay"] = replay;
    t0 = Clock::now();
    logits = replay == "full" ? m.Prefill(seq, prompt, model::PrefillMode::kFullDepth)
                              : m.Resume(seq, pages, resume_at, prompt,
                                         replay == "exact" ? model::ReplayMode::kExact
                                                           : model::ReplayMode::kBounded);
  } else {
    t0 = Clock::now();
    logits = m.Prefill(seq, prompt, mode);
  }
  if (!logits.ok()) return logits.status();
  const double ttft = Ms(t0, Clock::now());
  const model::ForwardStats stats = seq.last_stats();
  std::vector<uint32_t> generated;
  const auto d0 = Clock::now();
  if (greedy) {
    if (dspark) {
      // The drafter's first block after the prompt, as proposed (train/'s tests hold the
      // PyTorch drafter to it).
      KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> first, m.Draft(seq, model::Argmax(*logits)));
      out["first_draft"] = first;
    }
    KVC_ASSIGN_OR_RETURN(model::Generation g,
                         model::GenerateGreedy(m, seq, *std::move(logits), max_new, dspark));
    generated = g.tokens;
    if (dump.is_open()) {
      for (const std::vector<float>& l : g.logits)
        dump.write(reinterpret_cast<const char*>(l.data()),
                   static_cast<std::streamsize>(l.size() * sizeof(float)));
    }
    if (dspark) {
      out["dspark"] = {{"drafted", g.drafted},
                       {"accepted", g.accepted},
                       {"acceptance", g.acceptance()},
                       {"main_passes", g.main_passes}};
    }
  } else {
    uint64_t rng = seed;
    while (static_cast<int64_t>(generated.size()) < max_new) {
      if (dump.is_open()) {
        dump.write(reinterpret_cast<const char*>(logits->data()),
                   static_cast<std::streamsize>(logits->size() * sizeof(float)));
      }
      generated.push_back(Sample(*logits, /*greedy=*/false, rng));
      if (static_cast<int64_t>(generated.size()) == max_new) break;
      logits = m.Decode(seq, generated.back());
      if (!logits.ok()) return logits.status();
    }
  }
  const double decode_s = std::chrono::duration<double>(Clock::now() - d0).count();
  out["prompt_tokens"] = n;
  out["generated"] = generated;
  if (text_prompt) out["text"] = DecodeBytes(generated);
  out["prefill_tokens_computed"] = {{"encoder", stats.encoder_tokens},
                                    {"decoder", stats.decoder_tokens},
                                    {"decoder_compressor", stats.compressed_tokens}};
  out["replayed_tokens"] = stats.replayed_tokens;
  out["ced"] = !no_ced;
  out["ttft_ms"] = ttft;
  out["decode_tok_s"] = generated.size() > 1 && decode_s > 0
                            ? static_cast<double>(generated.size() - 1) / decode_s
                            : 0.0;
  // A continuation cut mid-character is not UTF-8: such bytes print as U+FFFD.
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"kvgen: run the kvcache engine on a prompt"};
  std::string config_path, weights_path, prompt_path, text_path, replay = "exact", dump_path,
                                                                 backend = "cpu";
  int64_t max_new = 16, resume_at = 0, chunk_tokens = 256;
  uint64_t seed = 0;
  bool greedy = false, no_ced = false, json = false, dspark = false;
  app.add_option("--config", config_path, "model config.json")->required();
  app.add_option("--weights", weights_path, "safetensors weights")->required();
  CLI::Option_group* prompts = app.add_option_group("prompt", "one of --prompt, --text-file");
  prompts->add_option("--prompt", prompt_path, "file of whitespace-separated token ids");
  prompts->add_option("--text-file", text_path,
                      "a text prompt, in byte tokens (models trained by train/)");
  prompts->require_option(1);
  app.add_option("--max-new-tokens", max_new, "tokens to generate")->check(CLI::NonNegativeNumber);
  app.add_flag("--greedy", greedy, "argmax sampling");
  app.add_option("--seed", seed, "sampling seed (without --greedy)");
  app.add_option("--resume-at", resume_at, "resume from the pages of the first P tokens")
      ->check(CLI::PositiveNumber);
  app.add_option("--replay", replay, "exact, bounded or full (with --resume-at)");
  app.add_flag("--no-ced", no_ced, "prefill every layer over every token");
  app.add_flag("--dspark", dspark, "speculative decoding with the DSpark drafter");
  app.add_option("--chunk-tokens", chunk_tokens, "tokens per page")->check(CLI::PositiveNumber);
  app.add_option("--dump-logits", dump_path, "write raw float32 logits of every step");
  model::AddBackendFlag(app, backend);
  app.add_flag("--json", json, "print one JSON object (the only output format)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "kvgen: error: " << e.what() << " (run kvgen --help)\n";
    return 2;
  }
  if (dspark && !greedy) {
    std::cerr << "kvgen: error: --dspark needs --greedy (speculative sampling is greedy here)\n";
    return 2;
  }
  const bool text_prompt = !text_path.empty();
  absl::Status s =
      Run(config_path, weights_path, text_prompt ? text_path : prompt_path, text_prompt, max_new,
          greedy, seed, resume_at, replay, no_ced, chunk_tokens, dump_path, dspark, backend);
  if (!s.ok()) {
    std::cerr << "kvgen: error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) { return kvc::Main(argc, argv); }
