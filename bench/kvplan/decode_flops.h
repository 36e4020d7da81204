// The work of one decoded token, by component, at a given context — analytically, from the
// config through the layer schedule (multiply-adds; a FLOP is two).
//
// What grows with the context in V4.1 Flash is the part that touches past positions:
// each layer's attention reads its window (at most W rows) and its top-k compressed rows
// (at most index_topk); each Full layer's indexer scores every visible compressed
// position (context / ratio); each Reindex layer scores only the candidate pool (at most
// candidate_topk_blocks × candidate_block_size positions). The rest — every projection,
// expert and the head — is the same at any context.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/spec/model_config.h"
#include "nlohmann/json.hpp"

namespace kvc {

struct DecodeWork {
  int64_t context_tokens = 0;
  // Multiply-adds per decoded token.
  double dense = 0;             // projections, experts (k routed + shared), Engram, head
  double window_attention = 0;  // q·k and p·v over the sliding window, every layer
  double sparse_attention = 0;  // q·k and p·v over the selected compressed rows
  double full_indexers = 0;     // the Full layers' indexers: every visible position
  double reindex_indexers = 0;  // the Reindex layers' indexers: the candidate pool
  double total() const {
    return dense + window_attention + sparse_attention + full_indexers + reindex_indexers;
  }
};

// One row per context. InvalidArgument for a config the schedule rejects or a context < 1.
absl::StatusOr<std::vector<DecodeWork>> DecodeWorkAt(const ModelConfig& config,
                                                     const std::vector<int64_t>& contexts);

nlohmann::json DecodeWorkToJson(const std::string& name, const std::vector<DecodeWork>& rows);
std::string DecodeWorkToText(const std::string& name, const std::vector<DecodeWork>& rows);

}  // namespace kvc
