// One turn of an agent session on the engine and the cache: the whole context so far plus
// the turn's new tokens go to the connector (resume from what is cached, replay, prefill
// the rest), generation follows (greedy or sampled), and the completed chunks go back to the cache.
// Also the byte-level tokenizer the CLI uses for text (token id = byte value).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/generate.h"
#include "nlohmann/json.hpp"
#include "serve/cache_connector.h"

namespace kvc::serve {

struct TurnResult {
  TurnReport report;
  std::vector<uint32_t> generated;
  std::vector<float> first_logits;  // the prompt's last position
  double decode_tok_s = 0;
};

// `context` is the session's whole history including this turn's new tokens.
// Tokens are chosen by `sampling` (default: greedy).
absl::StatusOr<TurnResult> RunTurn(const model::Model& model, CacheConnector& cache,
                                   std::span<const uint32_t> context, int64_t max_new_tokens,
                                   const model::SamplingOptions& sampling = {});

// The turn as JSON, the fields every report shares: context_tokens, reused_tokens,
// new_tokens, tier, prefilled_tokens {encoder, decoder}, replayed_tokens, fetched_bytes,
// fetch_ms, fetch_wait_ms, ttft_ms, decode_tok_s, warnings.
nlohmann::json TurnJson(const TurnResult& turn);

}  // namespace kvc::serve
