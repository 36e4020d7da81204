#include "base/status_macros.h"
#include "engine/model/model_impl.h"

#include <numeric>

namespace kvc::model {

// Globally unique numbers (model_impl.h says what for).
std::atomic<uint64_t> g_next_stamp{1};
uint64_t NextStamp() { return g_next_stamp.fetch_add(1, std::memory_order_relaxed); }

Sequence::Sequence(std::unique_ptr<SequenceState> s) : s_(std::move(s)) {}
Sequence::~Sequence() = default;
Sequence::Sequence(Sequence&&) noexcept = default;
Sequence& Sequence::operator=(Sequence&&) noexcept = default;
int64_t Sequence::length() const { return static_cast<int64_t>(s_->tokens.size()); }
const std::vector<uint32_t>& Sequence::tokens() const { return s_->tokens; }
int64_t Sequence::complete_chunks() const {
  return std::min(s_->full_tokens_, length()) / s_->chunk_tokens;
}
std::span<const uint8_t> Sequence::page(int64_t chunk) const {
  KVC_CHECK(chunk >= 0 && chunk < complete_chunks()) << "chunk " << chunk;
  return s_->pages[chunk];
}
const ForwardStats& Sequence::last_stats() const { return s_->stats; }

// ---- public API ----

Model::Model(std::unique_ptr<ModelImpl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
const ModelConfig& Model::config() const { return impl_->config; }
const LayerSchedule& Model::schedule() const { return impl_->sched; }
const ChunkLayout& Model::layout() const { return impl_->layout; }

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const ModelConfig& config,
                                                   const std::string& weights_path,
                                                   int64_t chunk_tokens) {
  ModelOptions options;
  options.chunk_tokens = chunk_tokens;
  return Load(config, weights_path, std::move(options));
}

const char* Model::matmul_backend() const { return impl_->mm->name(); }
const char* Model::attention_backend() const { return impl_->attn->name(); }
const char* Model::indexer_backend() const { return impl_->indexer->name(); }

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const ModelConfig& config,
                                                   const std::string& weights_path,
                                                   ModelOptions options) {
  const int64_t chunk_tokens = options.chunk_tokens;
  auto m = std::make_unique<ModelImpl>();
  m->mm = options.matmul ? std::move(options.matmul) : MakeCpuMatmul();
  m->attn = options.attention ? std::move(options.attention) : MakeCpuAttention();
  m->indexer = options.indexer ? std::move(options.indexer) : MakeCpuIndexer();
  if (absl::Status shape = m->attn->CheckShape(config.num_attention_heads, config.head_dim);
      !shape.ok()) {
    return shape;
  }
  m->config = config;
  KVC_ASSIGN_OR_RETURN(LayerSchedule sched, BuildLayerSchedule(config));
  m->sched = std::move(sched);
  KVC_ASSIGN_OR_RETURN(ChunkLayout layout, BuildChunkLayout(config, m->sched, chunk_tokens));
  m->layout = std::move(layout);
  m->dim = config.hidden_size;
  m->n_heads = config.num_attention_heads;
  m->head_dim = config.head_dim;
  m->rope_dim = config.qk_rope_head_dim;
  m->hc_mult = config.hc_mult;
  m->window = config.sliding_window;
  m->encoder_layers = m->sched.encoder_layers;
  m->n_layers = config.num_hidden_layers;
  m->draft_layers = config.num_nextn_predict_layers;
  m->targets = config.dspark_target_layer_ids;
  // What this engine supports, checked up front with the key that breaks it.
  if ((m->n_heads * m->head_dim) % config.o_groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_attention_heads × head_dim (", m->n_heads * m->head_dim,
                     ") is not divisible by o_groups ", config.o_groups));
  }
  if (m->head_dim % 32 != 0 || config.index_head_dim % 32 != 0) {
    return absl::InvalidArgumentError("head_dim and index_head_dim must be multiples of 32");
  }
  if (config.candidate_topk_blocks * config.candidate_block_size -
          (config.candidate_block_size - 1) <
      config.index_topk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate_topk_blocks × candidate_block_size − (candidate_block_size − 1) must be >= "
        "index_topk (",
        config.index_topk, "), or positions outside the candidate pool would be selected"));
  }
  for (int64_t l = m->encoder_layers; l < m->n_layers; ++l) {
    if (m->sched.layers[l].mode != AttentionMode::kFull) continue;
    if (m->decoder_full >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers ", m->decoder_full, " and ", l,
                       " are both Full decoder layers; CED computes one decoder global KV"));
    }
    m->decoder_full = l;
  }
  if (m->decoder_full != m->encoder_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the first decoder layer (", m->encoder_layers,
                     ") must be the decoder's only Full layer (CED)"));
  }
  for (int64_t l = 0; l < m->n_layers + m->draft_layers; ++l) {
    const bool compressed = config.compress_ratios[l] > 0;
    m->freqs.push_back(cpu::RopeFrequencies(
        m->rope_dim, compressed ? config.compress_rope_theta : config.rope_theta,
        compressed ? config.rope_scaling.original_max_position_embeddings : 0,
        config.rope_scaling.factor, config.rope_scaling.beta_fast, config.rope_scaling.beta_slow));
  }
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(weights_path));
  KVC_RETURN_IF_ERROR(m->LoadWeights(*f));
  m->ForEachWeight([&](const PackedMatrix& w) { m->mm->Register(w); });
  return std::unique_ptr<Model>(new Model(std::move(m)));
}

Sequence Model::NewSequence() const { return Sequence(impl_->NewState()); }

namespace {

void UpdateFullTokens(const ModelImpl& m, SequenceState& s) {
  int64_t full = std::numeric_limits<int64_t>::max();
  for (int64_t l = 0; l < m.n_layers; ++l) {
    if (m.sched.layers[l].mode == AttentionMode::kFull)
      full = std::min(full, s.layers[l].entries * m.sched.layers[l].compress_ratio);
  }
  s.full_tokens_ = full;
}

}  // namespace

absl::StatusOr<std::vector<float>> Model::Prefill(Sequence& seq, std::span<const uint32_t> tokens,
                                                  PrefillMode mode) const {
  const ModelImpl& m = *impl_;
  SequenceState& s = *seq.s_;
  if (!s.tokens.empty()) return absl::FailedPreconditionError("Prefill needs an empty sequence");
  if (tokens.empty()) return absl::InvalidArgumentError("the prompt is empty");
  KVC_RETURN_IF_ERROR(m.CheckTokens(tokens));
  const int64_t n = static_cast<int64_t>(tokens.size());
  s.tokens.assign(tokens.begin(), tokens.end());
  s.stats = {};
  std::vector<float> pre;
  std::vector<float> X = m.Embed(s, 0, n, &pre);
  if (mode == PrefillMode::kFullDepth) {
    const int64_t last = n - 1;
    std::vector<std::vector<float>> logits =
        m.LayersToLogits(s, 0, 0, n, X, pre, /*compress=*/true, std::span(&last, 1));
    s.stats.encoder_tokens = s.stats.decoder_tokens = n;
    UpdateFullTokens(m, s);
    return std::move(logits[0]);
  }
  m.RunLayers(s, 0, m.encoder_layers, 0, n, X, pre, /*compress=*/true);
  m.CompressDecoder(s, 0, n, X, pre);
  const int64_t seg = std::max<int64_t>(0, n - m.window);
  for (int64_t l = m.encoder_layers; l < m.n_layers; ++l) s.layers[l].window_start = seg;
  std::vector<float> Xs(X.begin() + seg * m.hc_mult * m.dim, X.end());
  std::vector<float> ps(pre.begin() + seg * m.hc_mult, pre.end());
  const int64_t last = n - seg - 1;
  std::vector<std::vector<float>> logits = m.LayersToLogits(
      s, m.encoder_layers, seg, n, Xs, ps, /*compress=*/false, std::span(&last, 1));
  s.stats.encoder_tokens = n;
  s.stats.compressed_tokens = n;
  s.stats.decoder_tokens = n - seg;
  UpdateFullTokens(m, s);
  return std::move(logits[0]);
}

std::vector<std::vector<float>> ModelImpl::Extend(SequenceState& s,
                                                  std::span<const uint32_t> tokens) const {
  const int64_t p = static_cast<int64_t>(s.tokens.size()), k = static_cast<int64_t>(tokens.size());
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  std::vector<float> pre;
  std::vector<float> X = Embed(s, p, p + k, &pre);
  std::vector<int64_t> rows(k);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<std::vector<float>> logits =
      LayersToLogits(s, 0, p, p + k, X, pre, /*compress=*/true, rows);
  s.stats = {
      .encoder_tokens = k, .decoder_tokens = k, .replayed_tokens = 0, .compressed_tokens = k};
  UpdateFullTokens(*this, s);
  return logits;
}

absl::StatusOr<std::vector<float>> Model::Decode(Sequence& seq, uint32_t token) const {
  KVC_ASSIGN_OR_RETURN(std::vector<std::vector<float>> l, Extend(seq, std::span(&token, 1)));
  return std::move((l)[0]);
}

absl::StatusOr<std::vector<std::vector<float>>> Model::Extend(
    Sequence& seq, std::span<const uint32_t> tokens) const {
  const ModelImpl& m = *impl_;
  SequenceState& s = *seq.s_;
  if (s.tokens.empty()) return absl::FailedPreconditionError("Decode needs a prefilled sequence");
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to run");
  KVC_RETURN_IF_ERROR(m.CheckTokens(tokens));
  return m.Extend(s, tokens);
}

bool Model::has_drafter() const { return impl_->draft_layers > 0; }

struct SequenceCheckpoint::Layer {
  std::vector<float> ring, pend_kv, pend_score;
  std::vector<int64_t> ring_pos;
  int64_t pend_rows = 0, entries = 0;
};

SequenceCheckpoint::SequenceCheckpoint() = default;
SequenceCheckpoint::~SequenceCheckpoint() = default;

SequenceCheckpoint Model::Checkpoint(const Sequence& seq) const {
  const SequenceState& s = *seq.s_;
  SequenceCheckpoint cp;
  cp.tokens_ = static_cast<int64_t>(s.tokens.size());
  cp.full_tokens_ = s.full_tokens_;
  for (const LayerState& ls : s.layers) {
    cp.layers_.push_back(
        {ls.ring, ls.pend_kv, ls.pend_score, ls.ring_pos, ls.pend_rows, ls.entries});
  }
  return cp;
}

void Model::Rollback(Sequence& seq, const SequenceCheckpoint& cp) const {
  SequenceState& s = *seq.s_;
  KVC_CHECK(cp.tokens_ <= static_cast<int64_t>(s.tokens.size()));
  s.tokens.resize(cp.tokens_);
  s.full_tokens_ = cp.full_tokens_;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    LayerState& ls = s.layers[l];
    const SequenceCheckpoint::Layer& config = cp.layers_[l];
    ls.ring = config.ring;
    ls.ring_pos = config.ring_pos;
    ls.pend_kv = config.pend_kv;
    ls.pend_score = config.pend_score;
    ls.pend_rows = config.pend_rows;
    // Rows emitted after the checkpoint are dropped; their page bytes are rewritten when
    // the positions are compressed again.
    ls.entries = config.entries;
    ls.main_f.resize(config.entries * impl_->head_dim);
    ls.index_f.resize(config.entries * impl_->config.index_head_dim);
  }
}

absl::StatusOr<std::vector<float>> Model::Resume(Sequence& seq, std::span<const uint8_t> pages,
                                                 int64_t cached, std::span<const uint32_t> tokens,
                                                 ReplayMode replay,
                                                 int64_t bounded_replay_tokens) const {
  return Resume(
      seq, [pages]() -> absl::StatusOr<std::span<const uint8_t>> { return pages; }, cached, tokens,
      replay, bounded_replay_tokens);
}

absl::StatusOr<std::vector<float>> Model::Resume(Sequence& seq, const PageSource& source,
                                                 int64_t cached, std::span<const uint32_t> tokens,
                                                 ReplayMode replay,
                                                 int64_t bounded_replay_tokens) const {
  const ModelImpl& m = *impl_;
  SequenceState& s = *seq.s_;
  const int64_t C = m.layout.chunk_tokens, n = static_cast<int64_t>(tokens.size());
  if (!s.tokens.empty()) return absl::FailedPreconditionError("Resume needs an empty sequence");
  if (replay == ReplayMode::kExact && !m.mm->batch_invariant()) {
    return absl::FailedPreconditionError(
        absl::StrCat("exact replay needs a batch-invariant matmul backend; \"", m.mm->name(),
                     "\" gives a row other bits in calls of other heights (use bounded replay)"));
  }
  if (bounded_replay_tokens < -1 || (replay == ReplayMode::kExact && bounded_replay_tokens != -1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bounded_replay_tokens is ", bounded_replay_tokens,
        "; it must be -1 (the model's window) or, with bounded replay only, a length ≥ 0"));
  }
  if (cached <= 0 || cached % C != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the cached prefix is ", cached,
                                                   " tokens; it must be a positive multiple of "
                                                   "the chunk size ",
                                                   C));
  }
  if (cached >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cached prefix (", cached, " tokens) must be shorter than the prompt (", n, ")"));
  }
  const int64_t chunks = cached / C;
  KVC_RETURN_IF_ERROR(m.CheckTokens(tokens));
  s.tokens.assign(tokens.begin(), tokens.end());
  s.stats = {};
  // Replay start: the model's window, or the encoder's whole dependency window before the
  // first position the decoder reads (exact).
  const int64_t seg = std::max<int64_t>(0, n - m.window);
  // A chosen replay length still covers the decoder's segment (the decoder reads the
  // encoder's output over its window): at least seg … cached is replayed.
  int64_t start = std::min(
      seg, std::max<int64_t>(
               0, cached - (bounded_replay_tokens >= 0 ? bounded_replay_tokens : m.window)));
  if (replay == ReplayMode::kExact) {
    start = std::max<int64_t>(0, std::min(cached, seg) - m.encoder_layers * m.window);
  }
  for (int64_t l = 0; l < m.encoder_layers; ++l) s.layers[l].window_start = start;
  for (int64_t l = m.encoder_layers; l < m.n_layers; ++l) s.layers[l].window_start = seg;
  std::vector<float> pre;
  std::vector<float> X = m.Embed(s, start, n, &pre);
  // The layers before the first compressed one read no page: they run while the pages
  // are still on their way.
  int64_t early = 0;
  while (early < m.encoder_layers && m.sched.layers[early].compress_ratio == 0) ++early;
  m.RunLayers(s, 0, early, start, n, X, pre, /*compress=*/true);
  KVC_ASSIGN_OR_RETURN(std::span<const uint8_t> got, source());
  const std::span<const uint8_t> pages = got;
  if (static_cast<int64_t>(pages.size()) != chunks * m.layout.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pages are ", pages.size(), " bytes; ", chunks,
                                                   " chunks need ", chunks * m.layout.chunk_bytes));
  }
  // Import: the pages as they are, and the dequantized rows attention reads.
  const int64_t Id = m.config.index_head_dim;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    std::vector<uint8_t>& page = s.WritePage(ch, m.layout.chunk_bytes);
    std::copy(pages.begin() + ch * m.layout.chunk_bytes,
              pages.begin() + (ch + 1) * m.layout.chunk_bytes, page.begin());
  }
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const LayerPlan& plan = m.sched.layers[l];
    if (plan.mode != AttentionMode::kFull) continue;
    LayerState& ls = s.layers[l];
    const int64_t per_chunk = C / plan.compress_ratio;
    ls.entries = chunks * per_chunk;
    ls.main_f.resize(ls.entries * m.head_dim);
    ls.index_f.resize(ls.entries * Id);
    const ChunkSection& mc = m.layout.Section(l, SectionKind::kMainCodes);
    const ChunkSection& ms = m.layout.Section(l, SectionKind::kMainScales);
    const ChunkSection& ic = m.layout.Section(l, SectionKind::kIndexCodes);
    const ChunkSection& is = m.layout.Section(l, SectionKind::kIndexScales);
    for (int64_t ch = 0; ch < chunks; ++ch) {
      std::span<const uint8_t> pg(s.pages[ch]);
      Dequantize(
          KvFormat::kMainKv, pg.subspan(mc.offset, mc.bytes), pg.subspan(ms.offset, ms.bytes),
          std::span<float>(ls.main_f.data() + ch * per_chunk * m.head_dim, per_chunk * m.head_dim));
      Dequantize(KvFormat::kIndexK, pg.subspan(ic.offset, ic.bytes),
                 pg.subspan(is.offset, is.bytes),
                 std::span<float>(ls.index_f.data() + ch * per_chunk * Id, per_chunk * Id));
    }
    for (size_t i = 0; i < ls.main_f.size(); ++i) {
      if (!std::isfinite(ls.main_f[i])) {
        return absl::DataLossError(absl::StrCat("page ", (i / m.head_dim) / per_chunk, " of layer ",
                                                l, " holds a non-finite value"));
      }
    }
  }
  m.RunLayers(s, early, m.encoder_layers, start, n, X, pre, /*compress=*/true);
  {
    const int64_t off = cached - start;
    m.CompressDecoder(s, cached, n,
                      std::vector<float>(X.begin() + off * m.hc_mult * m.dim, X.end()),
                      std::vector<float>(pre.begin() + off * m.hc_mult, pre.end()));
  }
  KVC_CHECK(seg >= start);
  std::vector<float> Xs(X.begin() + (seg - start) * m.hc_mult * m.dim, X.end());
  std::vector<float> ps(pre.begin() + (seg - start) * m.hc_mult, pre.end());
  const int64_t last = n - seg - 1;
  std::vector<std::vector<float>> logits = m.LayersToLogits(
      s, m.encoder_layers, seg, n, Xs, ps, /*compress=*/false, std::span(&last, 1));
  s.stats.encoder_tokens = n - start;
  s.stats.replayed_tokens = cached - start;
  s.stats.compressed_tokens = n - cached;
  s.stats.decoder_tokens = n - seg;
  UpdateFullTokens(m, s);
  return std::move(logits[0]);
}

}  // namespace kvc::model
