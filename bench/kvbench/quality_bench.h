// kvbench quality: what a resume from the cache costs in answers, with the C++ engine on a
// trained model and held-out text (docs/quality.md).
//
// Per document and resume point P (a multiple of the chunk size, past the window), the
// prompt is the document's first P + new_tokens tokens. Each mode runs it:
//   full             cold prefill at full depth (the reference)
//   ced              cold CED prefill (the decoder over the last window only)
//   bounded W        resume from the pages of the first P tokens, the encoder's windows
//                    rebuilt by replaying the last W cached tokens (W = the model's window
//                    is the model's own rule), the decoder as in CED
//   exact            the exact replay (must equal `ced` bit for bit)
// and then (a) greedy-decodes `greedy_steps` tokens and (b) reads the document's next
// `steps` tokens teacher-forced. Against a reference mode: KL(ref ‖ mode) of the next-token
// distribution after the prompt (mean, p99) and over the decode steps while both runs
// have produced the same tokens, greedy agreement over the steps, greedy identity (the
// share of cases whose every greedy token matches) and the first-divergence position, the
// teacher-forced loss difference in bits per byte, and whether every logit is
// bit-identical. Every mean carries a 95 % bootstrap interval over documents
// (bench/kvbench/bootstrap.h); the smallest and largest replay lengths are compared
// paired, case by case, to say whether the harness tells them apart; one case is run
// twice to show the run-to-run noise (the CPU engine is deterministic: none).
// DSpark: acceptance per draft depth and decode tokens/s beside plain greedy decoding in
// the same run (outputs must be equal), and the acceptance probed on the documents' own
// text, where greedy loops cannot flatter the drafter. Decode cost: per context, ms per decoded
// token by component (the backends timed), beside the analytical multiply-adds (kvplan flops).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct QualityBenchOptions {
  std::string config;                                         // model config
  std::vector<std::pair<std::string, std::string>> variants;  // (name, weights)
  std::string manifest;               // corpus manifest whose held-out split is read
  std::vector<std::string> held_out;  // text files instead of the manifest's split
  int documents = 16;                 // documents used (long enough, by path)
  uint64_t shuffle = 0;               // non-zero: the documents a seeded sample, not the first
  int points = 2;                     // resume points per document
  int64_t chunk_tokens = 64;
  // Prompt tokens after P; 0: the config's window, so that a replay of any length W up to
  // the window is what it says (fewer new tokens than the window make the decoder's
  // segment reach back into the cache, and every replay covers at least that).
  int64_t new_tokens = 0;
  int64_t steps = 64;                // teacher-forced tokens per case
  int64_t greedy_steps = 256;        // greedy-decoded tokens per case
  int bootstrap = 2000;              // resamples per interval
  uint64_t seed = 1;                 // of the resampling (intervals are reproducible)
  int64_t max_prompt_tokens = 3072;  // a full-depth prefill is quadratic in the prompt
  std::vector<int64_t> windows = {0, 32, 64, 128, 256};  // bounded replay lengths
  int dspark_prompts = 4;
  int64_t dspark_steps = 96;
  // DSpark probed on the documents' own text (no loops): every `every` tokens from 2W on,
  // up to `probes` per document, every document.
  int64_t dspark_probe_every = 16;
  int64_t dspark_probes = 32;
  std::vector<int64_t> decode_contexts;  // decode cost per context (empty: not measured)
  int64_t decode_tokens = 32;            // tokens timed per context
  // Threads running the cases (each a Sequence on the one Model); the figures are the
  // same bits for any count. DSpark and decode timings run afterwards on one.
  int jobs = 1;
};

absl::StatusOr<nlohmann::json> RunQualityBench(const QualityBenchOptions& options);
std::string QualityBenchToText(const nlohmann::json& result);

}  // namespace kvc::bench
