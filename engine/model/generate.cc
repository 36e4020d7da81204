#include "engine/model/generate.h"

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
      absl::StatusOr<std::vector<float>> l = model.Decode(seq, next);
      if (!l.ok()) return l.status();
      ++g.main_passes;
      next = Argmax(*l);
      g.tokens.push_back(next);
      g.logits.push_back(*std::move(l));
      continue;
    }
    absl::StatusOr<std::vector<uint32_t>> drafts = model.Draft(seq, next);
    if (!drafts.ok()) return drafts.status();
    std::vector<uint32_t> run = {next};
    run.insert(run.end(), drafts->begin(), drafts->end());
    const SequenceCheckpoint checkpoint = model.Checkpoint(seq);
    absl::StatusOr<std::vector<std::vector<float>>> verified = model.Extend(seq, run);
    if (!verified.ok()) return verified.status();
    ++g.main_passes;
    size_t kept = 0;
    while (kept < drafts->size() && Argmax((*verified)[kept]) == (*drafts)[kept]) ++kept;
    g.drafted += static_cast<int64_t>(drafts->size());
    g.accepted += static_cast<int64_t>(kept);
    ++g.blocks;
    if (g.kept_at_depth.size() < drafts->size()) g.kept_at_depth.resize(drafts->size(), 0);
    for (size_t d = 0; d < kept; ++d) ++g.kept_at_depth[d];
    if (kept < drafts->size()) {
      // Undo the rejected tail: roll back and run what was kept.
      model.Rollback(seq, checkpoint);
      absl::StatusOr<std::vector<std::vector<float>>> again =
          model.Extend(seq, std::span(run).first(kept + 1));
      if (!again.ok()) return again.status();
    }
    for (size_t i = 0; i < kept; ++i) {
      g.tokens.push_back((*drafts)[i]);
      g.logits.push_back((*verified)[i]);
    }
    next = Argmax((*verified)[kept]);
    g.tokens.push_back(next);
    g.logits.push_back((*verified)[kept]);
  }
  g.tokens.resize(max_new);
  g.logits.resize(max_new);
  return g;
}

}  // namespace kvc::model
