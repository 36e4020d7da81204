// Greedy generation, plain or speculative with the DSpark drafter.
//
// Speculative: the drafter proposes dspark_block_size tokens after the next one; the main
// model runs the next token and all proposals in one pass (Model::Extend), keeps the
// proposals its own greedy choice agrees with, and adds its choice at the first
// disagreement. Rejected tokens are rolled back and the accepted ones re-run, so the
// sequence state is exactly that of plain decoding: the output equals plain greedy output
// token for token (Extend is bit-identical to one-by-one decoding).
#pragma once

#include <cstdint>
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

}  // namespace kvc::model
