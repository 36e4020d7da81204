// The model's per-token operations as plain functions, so each can be checked against a
// naive reference (tests/engine/model/layer_ops_test.cc). Fixed operation order: a row's
// result never depends on other rows.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kvc::model {

// Ratio-2 compressor: per channel, softmax over the group's tokens of `score`, then the
// weighted sum of `kv` (rows of `dim`, `ratio` of them).
std::vector<float> PoolGroup(const float* kv, const float* score, int64_t ratio, int64_t dim);

// Sparse MQA for one query head: keys double as values; the sink enters the denominator
// only. o = Σ_t e^{σ_t−m} k_t / (Σ_t e^{σ_t−m} + e^{sink−m}), σ_t = scale·q·k_t.
void AttendHead(const float* q, std::span<const float* const> keys, int64_t dim, float sink,
                float scale, float* o);
// AttendHead for the `heads` query heads of one query, which read the same keys (MQA): q and
// o hold a row of `dim` per head, sinks one per head. The same bits as AttendHead per head;
// faster, since the heads share each pass over the keys.
void AttendHeads(const float* q, int64_t heads, std::span<const float* const> keys, int64_t dim,
                 const float* sinks, float scale, float* o);

// The candidate pool of one query: blocks of `block` positions scored by their best
// position, the block holding the newest visible position (cl − 1) always kept, the best
// `topk_blocks` kept; returns a 0/1 mask over the cl visible positions.
std::vector<uint8_t> CandidateMask(std::span<const float> scores, int64_t block,
                                   int64_t topk_blocks);

// MoE routing for one token: score = sqrt(softplus(logit)); the k best of score + bias
// (ties to the lower id); weights score / Σ (when `normalize`) × routed_scale. Returns
// (expert, weight) in expert order.
std::vector<std::pair<int32_t, float>> RouteToken(std::span<const float> logits,
                                                  std::span<const float> bias, int64_t k,
                                                  bool normalize, float routed_scale);

// Engram table rows of the token at `pos`: for n-gram order o (2…max) and head j,
// h_o = ⊕_{i<o} cmp(tok[pos−i])·m_i (int64, wrapping; pad once pos < i), row =
// h_o mod prime[o−2][j] + offset. `compressed` maps a token to its compressed id.
std::vector<int64_t> EngramRows(std::span<const uint32_t> tokens, int64_t pos,
                                std::span<const int64_t> multipliers,
                                std::span<const int64_t> primes, std::span<const int64_t> offsets,
                                int64_t heads, int64_t pad_token, int64_t compressed_vocab);

}  // namespace kvc::model
