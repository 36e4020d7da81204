// Generation: greedy (plain or speculative with the DSpark drafter) or sampled.
//
// Speculative: the drafter proposes dspark_block_size tokens after the next one; the main
// model runs the next token and all proposals in one pass (Model::Extend), keeps the
// proposals its own greedy choice agrees with, and adds its choice at the first
// disagreement. Rejected tokens are rolled back and the accepted ones re-run, so the
// sequence state is exactly that of plain decoding: the output equals plain greedy output
// token for token (Extend is bit-identical to one-by-one decoding).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"

namespace kvc::model {

struct Generation {
  std::vector<uint32_t> tokens;
  std::vector<std::vector<float>> logits;  // logits[k] chose tokens[k]
  int64_t main_passes = 0;                 // main-model passes after the prefill
  int64_t drafted = 0, accepted = 0;       // DSpark proposals and how many were kept
  // DSpark per draft depth: kept_at_depth[d] counts the verified blocks (one per main pass)
  // whose proposal d (0-based) was kept, and so every one before it.
  std::vector<int64_t> kept_at_depth;
  double acceptance() const {
    return drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
  }
};

// Generates `max_new` tokens after a prefill whose last logits are `first`.
absl::StatusOr<Generation> GenerateGreedy(const Model& model, Sequence& seq,
                                          std::vector<float> first, int64_t max_new,
                                          bool speculative);

uint32_t Argmax(const std::vector<float>& logits);  // ties to the lower id

// How the next token is chosen. temperature 0 is greedy (Argmax); otherwise softmax of
// logits / temperature, cut to the smallest set of most likely tokens whose probability
// reaches top_p (nucleus sampling; 1 keeps every token), drawn with a generator seeded by
// `seed`: the same seed, logits and options give the same tokens on every machine.
struct SamplingOptions {
  double temperature = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0; }
};

// Checks the ranges: temperature ≥ 0 and finite, top_p in (0, 1]; the error names the flag.
absl::Status CheckSampling(const SamplingOptions& o);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : options_(o), state_(o.seed) {}
  uint32_t Next(const std::vector<float>& logits);

 private:
  double Uniform();  // in (0, 1), 53 bits, from a splitmix64 stream
  SamplingOptions options_;
  uint64_t state_;
  std::vector<std::pair<double, uint32_t>> order_;  // reused: probability, token
};

// Generates `max_new` tokens after a prefill whose last logits are `first`, chosen by
// `sampling` (greedy: GenerateGreedy without the drafter).
absl::StatusOr<Generation> Generate(const Model& model, Sequence& seq, std::vector<float> first,
                                    int64_t max_new, const SamplingOptions& sampling);

}  // namespace kvc::model
