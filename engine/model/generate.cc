#include "engine/model/generate.h"
#include "base/status_macros.h"

#include <algorithm>

namespace kvc::model {

uint32_t Argmax(const std::vector<float>& logits) {
  return static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

absl::StatusOr<Generation> GenerateGreedy(const Model& model, Sequence& seq,
                                          std::vector<float> first, int64_t max_new,
                                          bool speculative) {
  Generation g;
  if (max_new <= 0) return g;
  if (speculative && !model.has_drafter()) {
    return absl::FailedPreconditionError("the config has no DSpark draft layers");
  }
  uint32_t next = Argmax(first);
  g.tokens.push_back(next);
  g.logits.push_back(std::move(first));
  while (static_cast<int64_t>(g.tokens.size()) < max_new) {
    if (!speculative) {
      KVC_ASSIGN_OR_RETURN(std::vector<float> l, model.Decode(seq, next));
      ++g.main_passes;
      next = Argmax(l);
      g.tokens.push_back(next);
      g.logits.push_back(std::move(l));
      continue;
    }
    KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> drafts, model.Draft(seq, next));
    std::vector<uint32_t> run = {next};
    run.insert(run.end(), drafts.begin(), drafts.end());
    const SequenceCheckpoint checkpoint = model.Checkpoint(seq);
    KVC_ASSIGN_OR_RETURN(std::vector<std::vector<float>> verified, model.Extend(seq, run));
    ++g.main_passes;
    size_t kept = 0;
    while (kept < drafts.size() && Argmax((verified)[kept]) == (drafts)[kept]) ++kept;
    g.drafted += static_cast<int64_t>(drafts.size());
    g.accepted += static_cast<int64_t>(kept);
    if (g.kept_at_depth.size() < drafts.size()) g.kept_at_depth.resize(drafts.size(), 0);
    for (size_t d = 0; d < kept; ++d) ++g.kept_at_depth[d];
    if (kept < drafts.size()) {
      // Undo the rejected tail: roll back and run what was kept.
      model.Rollback(seq, checkpoint);
      KVC_ASSIGN_OR_RETURN(std::vector<std::vector<float>> again,
                           model.Extend(seq, std::span(run).first(kept + 1)));
    }
    for (size_t i = 0; i < kept; ++i) {
      g.tokens.push_back((drafts)[i]);
      g.logits.push_back((verified)[i]);
    }
    next = Argmax((verified)[kept]);
    g.tokens.push_back(next);
    g.logits.push_back((verified)[kept]);
  }
  g.tokens.resize(max_new);
  g.logits.resize(max_new);
  return g;
}

}  // namespace kvc::model
