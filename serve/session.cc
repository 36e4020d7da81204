#include "serve/session.h"

#include <chrono>

#include "base/status_macros.h"
#include "engine/model/generate.h"

namespace kvc::serve {

absl::StatusOr<TurnResult> RunTurn(const model::Model& model, CacheConnector& cache,
                                   std::span<const uint32_t> context, int64_t max_new_tokens,
                                   const model::SamplingOptions& sampling) {
  TurnResult t;
  model::Sequence seq = model.NewSequence();
  KVC_ASSIGN_OR_RETURN(std::vector<float> logits, cache.Prefill(seq, context, &t.report));
  t.first_logits = logits;
  // The prompt's pages go to the cache before decoding starts (in the background).
  cache.StoreNewChunks(seq);
  const auto d0 = std::chrono::steady_clock::now();
  KVC_ASSIGN_OR_RETURN(model::Generation g,
                       model::Generate(model, seq, std::move(logits), max_new_tokens, sampling));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
  t.generated = g.tokens;
  t.decode_tok_s = t.generated.size() > 1 && s > 0 ? (t.generated.size() - 1) / s : 0;
  // Pages completed while generating (the generated tokens are part of the next turn's
  // context; the last one was sampled but not run, so the next turn computes it).
  cache.StoreNewChunks(seq);
  return t;
}

nlohmann::json TurnJson(const TurnResult& t) {
  const TurnReport& r = t.report;
  return {{"context_tokens", r.prompt_tokens},
          {"reused_tokens", r.reused_tokens},
          {"new_tokens", r.prompt_tokens - r.reused_tokens},
          {"tier", r.tier},
          {"nodes", r.nodes},
          {"prefilled_tokens", {{"encoder", r.encoder_tokens}, {"decoder", r.decoder_tokens}}},
          {"replayed_tokens", r.replayed_tokens},
          {"fetched_bytes", r.fetched_bytes},
          {"hbm_chunks", r.hbm_chunks},
          {"fetch_ms", r.fetch_ms},
          {"fetch_wait_ms", r.fetch_wait_ms},
          {"ttft_ms", r.ttft_ms},
          {"decode_tok_s", t.decode_tok_s},
          {"warnings", r.warnings}};
}

}  // namespace kvc::serve
