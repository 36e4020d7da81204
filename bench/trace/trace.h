// Request traces for capacity planning: the Mooncake conversation-trace format and an
// agent-session format of our own, both turned into prompts of token ids
// deterministically, so equal prefixes give equal tokens and equal chunk keys.
//
// Mooncake (one JSON object per line, in arrival order; shared/reference/traces/README):
//   {"timestamp": MS, "input_length": N, "output_length": M, "hash_ids": [id, …]}
// one id per 512-token block of the prompt (the last block may be partial). Block `id`'s
// token j is TokenOf(id, j): equal ids at equal positions give equal tokens.
//
// Agent sessions (JSON lines; a session's turns in order, sessions interleaved freely):
//   {"session": "S", "turn": K, "tokens": APPENDED, "think_s": SECONDS[, "output": M]}
// Turn K's prompt is the session's whole history: every token appended so far. The first
// turn arrives at "start_s" (default 0); each later one think_s after the previous. A
// session's token at position p is TokenOf(hash of S, p), so every turn's prompt extends
// the previous one's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::trace {

inline constexpr int64_t kMooncakeBlockTokens = 512;
// The longest prompt a request may have (a session's history included): 2^28 tokens,
// far past any model's context, small enough that its token ids fit in memory.
inline constexpr int64_t kMaxPromptTokens = int64_t{1} << 28;

struct Request {
  double arrival_s = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  std::vector<uint64_t> block_ids;  // Mooncake: one per 512-token block
  uint64_t session = 0;             // agent sessions: the session's hash (block_ids empty)
};

// Reads either format (told apart by the first line's fields). InvalidArgument naming the
// file, line and field for anything malformed: a missing or negative field, too few or
// too many hash ids for input_length, a prompt over kMaxPromptTokens, a turn out of
// order, times going backwards.
// `limit` > 0 keeps the first `limit` requests (by arrival).
absl::StatusOr<std::vector<Request>> ReadTrace(const std::string& path, int64_t limit = 0);

// SplitMix64's finalizer: a well-mixed 64-bit value for each input.
uint64_t Mix(uint64_t x);

// The id of token j of a block (or of a session at position j), below vocab_size.
uint32_t TokenOf(uint64_t id, uint64_t j, uint32_t vocab_size);

// A request's prompt as token ids.
std::vector<uint32_t> PromptTokens(const Request& r, uint32_t vocab_size);

// Seconds from the first arrival to the last.
double TraceSeconds(const std::vector<Request>& requests);

}  // namespace kvc::trace
