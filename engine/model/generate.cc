#include "engine/model/generate.h"
#include "base/status_macros.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/splitmix.h"

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

absl::Status CheckSampling(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature is ", o.temperature, "; use 0 (greedy) or a positive number"));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-p is ", o.top_p, "; use a share in (0, 1]"));
  }
  return absl::OkStatus();
}

double Sampler::Uniform() {
  return (static_cast<double>(SplitMix64(state_) >> 11) + 0.5) * 0x1.0p-53;
}

uint32_t Sampler::Next(const std::vector<float>& logits) {
  if (options_.greedy() || logits.empty()) return Argmax(logits);
  // Softmax in double from the largest logit, so no exponent overflows.
  const double top = *std::max_element(logits.begin(), logits.end());
  order_.clear();
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp((logits[i] - top) / options_.temperature);
    order_.emplace_back(p, static_cast<uint32_t>(i));
    total += p;
  }
  // Most likely first, ties to the lower id: the nucleus is the same on every machine.
  std::sort(order_.begin(), order_.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  size_t kept = 0;
  double mass = 0;
  while (kept < order_.size() && (kept == 0 || mass < options_.top_p * total)) {
    mass += order_[kept++].first;
  }
  double u = Uniform() * mass;
  for (size_t i = 0; i < kept; ++i) {
    u -= order_[i].first;
    if (u <= 0) return order_[i].second;
  }
  return order_[kept - 1].second;  // rounding left a sliver: the least likely kept token
}

absl::StatusOr<Generation> Generate(const Model& model, Sequence& seq, std::vector<float> first,
                                    int64_t max_new, const SamplingOptions& sampling) {
  KVC_RETURN_IF_ERROR(CheckSampling(sampling));
  if (sampling.greedy()) return GenerateGreedy(model, seq, std::move(first), max_new, false);
  Generation g;
  Sampler sampler(sampling);
  std::vector<float> logits = std::move(first);
  while (static_cast<int64_t>(g.tokens.size()) < max_new) {
    g.tokens.push_back(sampler.Next(logits));
    g.logits.push_back(std::move(logits));
    if (static_cast<int64_t>(g.tokens.size()) == max_new) break;
    KVC_ASSIGN_OR_RETURN(logits, model.Decode(seq, g.tokens.back()));
    ++g.main_passes;
  }
  return g;
}

}  // namespace kvc::model
