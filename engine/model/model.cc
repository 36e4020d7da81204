#include "engine/model/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/layer_ops.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/spec/check.h"
#include "engine/spec/kv_codec.h"

namespace kvc::model {

using cpu::PackedMatrix;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- weights in compute form ----

struct AttentionWeights {
  PackedMatrix wq_a, wq_b, wkv, wo_b;
  std::vector<PackedMatrix> wo_a;  // one per output group
  std::vector<float> q_norm, kv_norm, sink;
  // Full layers: the compressor and the index-key side of the indexer.
  PackedMatrix c_wkv, c_wgate, i_wk;
  std::vector<float> c_norm, i_k_norm;
  // Full and Reindex layers: the indexer's query side.
  PackedMatrix i_wq_b, i_weights;
};

struct ExpertWeights {
  PackedMatrix w1, w3, w2;
};

struct EngramWeights {
  std::vector<float> table;              // rows × engram_head_dim
  PackedMatrix wkv;                      // (hc+1)·D × orders·heads·engram_head_dim
  std::vector<float> qw, kw;             // hc × D
  std::vector<int64_t> primes, offsets;  // orders·heads
  std::vector<int64_t> multipliers;      // max_ngram
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  PackedMatrix hc_fn[2];
  std::vector<float> hc_base[2], hc_scale[2];
  AttentionWeights attn;
  PackedMatrix gate;
  std::vector<float> gate_bias;
  std::vector<ExpertWeights> experts;
  int64_t experts_per_token = 0;
  ExpertWeights shared;
  std::unique_ptr<EngramWeights> engram;
};

// The DSpark drafter's own tensors (its blocks are LayerWeights after the trunk's).
struct DraftWeights {
  PackedMatrix main_proj, markov_head;
  std::vector<float> main_norm, norm, markov_embed;
};

// ---- per-sequence state ----

struct LayerState {
  std::vector<float> ring;        // window × head_dim, FP8-QAT'd window KV
  std::vector<int64_t> ring_pos;  // position held by each slot, -1 when empty
  int64_t window_start = 0;       // lowest position whose window KV is valid here
  // Full layers: the compressor's open group and the emitted rows (dequantized).
  std::vector<float> pend_kv, pend_score;
  int64_t pend_rows = 0;
  int64_t entries = 0;
  std::vector<float> main_f, index_f;
};

// Globally unique numbers: a sequence's identity, and the version a page gets each time
// its bytes change (so a device copy tagged with a version is current exactly when the
// versions match, whatever sequence or page it came from).
std::atomic<uint64_t> g_next_stamp{1};
uint64_t NextStamp() { return g_next_stamp.fetch_add(1, std::memory_order_relaxed); }

class SequenceState {
 public:
  std::vector<uint32_t> tokens;
  std::vector<LayerState> layers;
  std::vector<std::vector<uint8_t>> pages;
  std::vector<uint64_t> page_versions;  // one per page; a new one on every write
  const uint64_t id = NextStamp();
  // Page `chunk` (created zeroed if missing) is about to change.
  std::vector<uint8_t>& WritePage(int64_t chunk, int64_t chunk_bytes) {
    while (static_cast<int64_t>(pages.size()) <= chunk) {
      pages.emplace_back(chunk_bytes, uint8_t{0});
      page_versions.push_back(NextStamp());
    }
    page_versions[chunk] = NextStamp();
    return pages[chunk];
  }
  ForwardStats stats;
  int64_t chunk_tokens = 0;
  int64_t min_full_tokens() const { return full_tokens_; }
  int64_t full_tokens_ = 0;  // tokens every Full layer has compressed
};

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

// ---- the model ----

class ModelImpl {
 public:
  ModelConfig c;
  LayerSchedule sched;
  ChunkLayout layout;
  int64_t D = 0, H = 0, hd = 0, rd = 0, hc = 0, win = 0, E = 0, L = 0;
  std::vector<float> embed;  // V × D
  std::vector<float> norm;
  PackedMatrix head;
  std::vector<LayerWeights> layers;        // trunk, then draft layers
  std::vector<std::vector<double>> freqs;  // per layer
  int64_t decoder_full = -1;               // the decoder's Full layer (its global KV)
  int64_t ND = 0;                          // DSpark draft layers
  std::vector<int64_t> targets;            // DSpark target layers, in order
  DraftWeights draft;

  std::unique_ptr<MatmulBackend> mm;        // where every matrix product runs
  std::unique_ptr<AttentionBackend> attn;   // where the sparse attention runs
  std::unique_ptr<IndexerBackend> indexer;  // where the indexer scores and selects

  absl::Status LoadWeights(const SafetensorsFile& f);
  // Every weight matrix, for the matmul backend to keep resident.
  void ForEachWeight(const std::function<void(const PackedMatrix&)>& fn) const;
  // x (rows × in) → y (rows × out).
  std::vector<float> Linear(const std::vector<float>& x, int64_t rows,
                            const PackedMatrix& w) const {
    std::vector<float> y(rows * w.out_features());
    mm->Gemm(x.data(), rows, w, y.data());
    return y;
  }

  // One pass of layers [l0, l1) over positions [a, b). X: (b−a) × hc × D, pre: (b−a) × hc.
  // `compress`: Full layers run their compressor on positions not yet compressed.
  // `main_hidden` (optional): filled with each row's stream mean at the input of the DSpark
  // target layers (rows × targets·D), for the drafter's rings.
  void RunLayers(SequenceState& s, int64_t l0, int64_t l1, int64_t a, int64_t b,
                 std::vector<float>& X, std::vector<float>& pre, bool compress,
                 std::vector<float>* main_hidden = nullptr) const;
  // Writes the drafter's rings for positions [a, b) from their main hidden states.
  void UpdateDraftRings(SequenceState& s, int64_t a, int64_t b,
                        const std::vector<float>& main_hidden) const;
  // Queries (low rank, normalized, up-projected, rotated per head) and the rows' own window
  // KV (normalized, rotated, FP8-QAT'd), for positions a, a+1, …. With qi and wts, also
  // the indexer's raw query and weight projections. All products go as one group, the
  // up-projections chained on the normalized low-rank query, with `also` (the mixes', the
  // compressor's; a chained input in `also` counts from its first call): one wait on a
  // device.
  void QueriesAndWindowKv(int64_t l, int64_t a, int64_t rows, const std::vector<float>& x,
                          std::vector<float>& q, std::vector<float>& kv,
                          std::vector<float>* qi = nullptr, std::vector<float>* wts = nullptr,
                          std::span<const GemmCall> also = {}) const;
  // `also`: products issued with the sublayer's first group (the next mixes).
  void DraftAttention(SequenceState& s, int64_t l, int64_t a, int64_t b,
                      const std::vector<float>& x, std::vector<float>& out,
                      std::span<const GemmCall> also = {}) const;
  // Sparse MQA of `rows` queries (q: rows × H × hd at positions a…) over the rows `batch`
  // lists for each query (window, entries, compressed rows), then the inverse RoPE and the
  // grouped low-rank output projection.
  void AttendAndProject(int64_t l, int64_t a, int64_t rows, const std::vector<float>& q,
                        AttentionBatch batch, std::vector<float>& out) const;
  // Runs `tokens` after the sequence's last token; logits of every one.
  std::vector<std::vector<float>> Extend(SequenceState& s, std::span<const uint32_t> tokens) const;
  // The decoder's global KV for positions [a, b) from the encoder output (CED).
  void CompressDecoder(SequenceState& s, int64_t a, int64_t b, std::vector<float> X,
                       const std::vector<float>& pre) const;
  std::vector<float> Embed(const SequenceState& s, int64_t a, int64_t b,
                           std::vector<float>* pre) const;
  std::vector<float> Logits(const std::vector<float>& X, const std::vector<float>& pre, int64_t row,
                            const std::vector<float>* final_norm = nullptr) const;
  absl::Status CheckTokens(std::span<const uint32_t> tokens) const;
  void ApplyEngram(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                   std::vector<float>& X) const;
  void Attention(SequenceState& s, int64_t l, int64_t a, int64_t b, const std::vector<float>& x,
                 bool compress, std::vector<float>& out,
                 std::map<int64_t, std::vector<std::vector<int32_t>>>& topk,
                 std::vector<std::vector<uint8_t>>& pool,
                 std::span<const GemmCall> also = {}) const;
  // The compressor of Full layer l over the pass [a, b) with input x: the products for the
  // positions it has not consumed yet go into `calls` (results in `in`), and Compress
  // consumes them once they are done — so the products can join another group (the query
  // path's: one wait on a device).
  struct CompressorInput {
    int64_t first = 0, rows = 0;  // positions [first, first + rows)
    std::vector<float> kv, score;
    // Ratio 1 (an entry per position): the entries' index keys, chained on kv normalized.
    std::vector<float> keys;
  };
  void CompressorCalls(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                       const std::vector<float>& x, CompressorInput& in,
                       std::vector<GemmCall>& calls) const;
  void Compress(SequenceState& s, int64_t l, const CompressorInput& in) const;
  void Compress(SequenceState& s, int64_t l, int64_t a, int64_t b,
                const std::vector<float>& x) const;  // the products on their own
  void EmitEntry(SequenceState& s, int64_t l, std::span<float> latent, std::span<float> k) const;
  // Appends compressed entries to Full layer l: `latents` (entries × hd, normalized,
  // RoPE-free), their index keys from one product (one wait on a device however many).
  // `keys` (entries × index_head_dim) when the product is done already.
  void EmitEntries(SequenceState& s, int64_t l, std::vector<float> latents,
                   std::vector<float> keys = {}) const;
  void Moe(int64_t l, const std::vector<float>& x, int64_t rows, std::vector<float>& out,
           std::span<const GemmCall> also = {}) const;
  std::unique_ptr<SequenceState> NewState() const;
};

namespace {

template <typename T>
std::span<const T> Row(const std::vector<T>& v, int64_t row, int64_t width) {
  return std::span<const T>(v.data() + row * width, width);
}

// Appends `also` to a group; a chained input in `also` counts from the first of `also`.
void AppendToGroup(std::vector<GemmCall>& calls, std::span<const GemmCall> also) {
  const int64_t base = static_cast<int64_t>(calls.size());
  for (GemmCall c : also) {
    if (c.input_of >= 0) c.input_of += base;
    calls.push_back(c);
  }
}

void NormRows(std::vector<float>& x, int64_t rows, int64_t width, const std::vector<float>& w,
              double eps) {
  for (int64_t r = 0; r < rows; ++r)
    cpu::RmsNorm(&x[r * width], w.data(), width, eps, &x[r * width]);
}

}  // namespace

std::unique_ptr<SequenceState> ModelImpl::NewState() const {
  auto s = std::make_unique<SequenceState>();
  s->chunk_tokens = layout.chunk_tokens;
  s->layers.resize(L + ND);
  for (LayerState& ls : s->layers) {
    ls.ring.assign(win * hd, 0.0f);
    ls.ring_pos.assign(win, -1);
  }
  return s;
}

absl::Status ModelImpl::CheckTokens(std::span<const uint32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= static_cast<uint32_t>(c.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " is ", tokens[i],
                                                     ", outside the vocabulary of ", c.vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelImpl::LoadWeights(const SafetensorsFile& f) {
  const std::vector<ParameterSpec> specs = ModelParameters(c, sched);
  std::set<std::string> expected;
  for (const ParameterSpec& p : specs) expected.insert(p.name);
  for (const auto& [name, t] : f.tensors()) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": tensor \"", name, "\" is not part of this config's model"));
    }
  }
  std::map<std::string, std::vector<float>> t;
  for (const ParameterSpec& p : specs) {
    absl::StatusOr<std::vector<float>> v = f.ReadF32(p.name, p.shape);
    if (!v.ok()) return v.status();
    t[p.name] = *std::move(v);
  }
  auto take = [&](const std::string& n) { return std::move(t.at(n)); };
  auto mat = [&](const std::string& n, int64_t rows, int64_t cols) {
    return PackedMatrix(t.at(n), rows, cols);
  };
  embed = take("embed.weight");
  norm = take("norm.weight");
  head = mat("head.weight", c.vocab_size, D);
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes = EngramPrimes(c);
  if (!primes.ok()) return primes.status();
  layers.resize(L + ND);
  // What every block has (trunk and draft).
  auto load_block = [&](int64_t l, int64_t experts, int64_t per_token) {
    LayerWeights& w = layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    w.attn_norm = take(p + "attn_norm.weight");
    w.ffn_norm = take(p + "ffn_norm.weight");
    const char* subs[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; ++s) {
      w.hc_fn[s] = mat(absl::StrCat(p, "hc_", subs[s], "_fn"), (2 + hc) * hc, hc * D);
      w.hc_base[s] = take(absl::StrCat(p, "hc_", subs[s], "_base"));
      w.hc_scale[s] = take(absl::StrCat(p, "hc_", subs[s], "_scale"));
    }
    AttentionWeights& a = w.attn;
    const std::string at = p + "attn.";
    a.wq_a = mat(at + "wq_a.weight", c.q_lora_rank, D);
    a.q_norm = take(at + "q_norm.weight");
    a.wq_b = mat(at + "wq_b.weight", H * hd, c.q_lora_rank);
    a.wkv = mat(at + "wkv.weight", hd, D);
    a.kv_norm = take(at + "kv_norm.weight");
    a.sink = take(at + "attn_sink");
    const int64_t G = c.o_groups, gw = H * hd / G;
    const std::vector<float>& wo_a = t.at(at + "wo_a.weight");
    for (int64_t g = 0; g < G; ++g) {
      a.wo_a.emplace_back(
          std::span<const float>(wo_a.data() + g * c.o_lora_rank * gw, c.o_lora_rank * gw),
          c.o_lora_rank, gw);
    }
    a.wo_b = mat(at + "wo_b.weight", D, G * c.o_lora_rank);
    const std::string ff = p + "ffn.";
    w.gate = mat(ff + "gate.weight", experts, D);
    w.gate_bias = take(ff + "gate.bias");
    const int64_t I = c.moe_intermediate_size;
    auto expert = [&](const std::string& e) {
      return ExpertWeights{mat(e + "w1.weight", I, D), mat(e + "w3.weight", I, D),
                           mat(e + "w2.weight", D, I)};
    };
    for (int64_t e = 0; e < experts; ++e)
      w.experts.push_back(expert(absl::StrCat(ff, "experts.", e, ".")));
    w.experts_per_token = per_token;
    w.shared = expert(ff + "shared_experts.");
  };
  for (int64_t l = L; l < L + ND; ++l) {
    load_block(l, c.dspark_n_routed_experts, c.dspark_num_experts_per_tok);
  }
  if (ND > 0) {
    const int64_t nt = static_cast<int64_t>(targets.size());
    draft.main_proj = mat("dspark.main_proj.weight", D, nt * D);
    draft.main_norm = take("dspark.main_norm.weight");
    draft.norm = take("dspark.norm.weight");
    draft.markov_embed = take("dspark.markov.embed");
    draft.markov_head = mat("dspark.markov.head", c.vocab_size, c.dspark_markov_rank);
  }
  for (int64_t l = 0; l < L; ++l) {
    const LayerPlan& plan = sched.layers[l];
    load_block(l, c.n_routed_experts, c.num_experts_per_tok);
    LayerWeights& w = layers[l];
    AttentionWeights& a = w.attn;
    const std::string p = absl::StrCat("layers.", l, ".");
    const std::string at = p + "attn.";
    if (plan.mode == AttentionMode::kFull) {
      a.c_wkv = mat(at + "compressor.wkv.weight", hd, D);
      if (plan.compress_ratio > 1) a.c_wgate = mat(at + "compressor.wgate.weight", hd, D);
      a.c_norm = take(at + "compressor.norm.weight");
      a.i_wk = mat(at + "indexer.wk.weight", c.index_head_dim, hd);
      a.i_k_norm = take(at + "indexer.k_norm.weight");
    }
    if (plan.runs_indexer()) {
      a.i_wq_b = mat(at + "indexer.wq_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      a.i_weights = mat(at + "indexer.weights_proj.weight", c.index_n_heads, D);
    }
    if (plan.has_engram) {
      size_t slot = 0;
      while (c.engram_layer_ids[slot] != l) ++slot;
      if (c.engram_multipliers.empty()) {
        return absl::InvalidArgumentError(
            "the config has Engram layers but no engram_multipliers (scripts/"
            "engram_multipliers.py prints them for a config)");
      }
      auto eg = std::make_unique<EngramWeights>();
      const std::string e = p + "engram.";
      const int64_t width = (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim;
      eg->table = take(e + "table");
      eg->wkv = mat(e + "wkv.weight", (hc + 1) * D, width);
      eg->qw = take(e + "qw");
      eg->kw = take(e + "kw");
      eg->primes = (*primes)[slot];
      int64_t off = 0;
      for (int64_t pr : eg->primes) {
        eg->offsets.push_back(off);
        off += pr;
      }
      eg->multipliers = c.engram_multipliers[slot];
      w.engram = std::move(eg);
    }
  }
  return absl::OkStatus();
}

std::vector<float> ModelImpl::Embed(const SequenceState& s, int64_t a, int64_t b,
                                    std::vector<float>* pre) const {
  const int64_t rows = b - a;
  std::vector<float> X(rows * hc * D);
  pre->assign(rows * hc, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* e = embed.data() + static_cast<int64_t>(s.tokens[a + r]) * D;
    for (int64_t k = 0; k < hc; ++k) std::copy(e, e + D, X.data() + (r * hc + k) * D);
    (*pre)[r * hc] = 1.0f;  // the first layer reads copy 0
  }
  return X;
}

void ModelImpl::ApplyEngram(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                            std::vector<float>& X) const {
  const EngramWeights& eg = *layers[l].engram;
  const int64_t rows = b - a, n = c.engram_max_ngram_size, heads = c.engram_n_heads,
                ehd = c.engram_head_dim, width = (n - 1) * heads * ehd;
  // Compressed token ids: the identity map for configs whose vocabulary fits (small ones).
  std::vector<float> Ein(rows * width);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int64_t> ids =
        EngramRows(s.tokens, a + r, eg.multipliers, eg.primes, eg.offsets, heads,
                   c.engram_pad_token_id, c.engram_compressed_vocab_size);
    for (size_t slot = 0; slot < ids.size(); ++slot) {
      std::copy(eg.table.begin() + ids[slot] * ehd, eg.table.begin() + (ids[slot] + 1) * ehd,
                Ein.begin() + r * width + slot * ehd);
    }
  }
  const std::vector<float> KV = Linear(Ein, rows, eg.wkv);  // rows × (hc+1)·D
  const double eps = 1e-20;
  for (int64_t r = 0; r < rows; ++r) {
    const float* V = KV.data() + (r * (hc + 1) + hc) * D;
    for (int64_t k = 0; k < hc; ++k) {
      float* h = X.data() + (r * hc + k) * D;
      const float* K = KV.data() + (r * (hc + 1) + k) * D;
      double dot = 0, hh = 0, kk = 0;
      for (int64_t i = 0; i < D; ++i) {
        dot += static_cast<double>(h[i]) * eg.qw[k * D + i] * eg.kw[k * D + i] * K[i];
        hh += static_cast<double>(h[i]) * h[i];
        kk += static_cast<double>(K[i]) * K[i];
      }
      const double d = dot / std::sqrt(hh / D + eps) / std::sqrt(kk / D + eps) /
                       std::sqrt(static_cast<double>(D));
      const float g = cpu::Sigmoid(
          static_cast<float>((d >= 0 ? 1.0 : -1.0) * std::sqrt(std::max(std::abs(d), 1e-6))));
      for (int64_t i = 0; i < D; ++i) h[i] += g * V[i];
    }
  }
}

void ModelImpl::EmitEntries(SequenceState& s, int64_t l, std::vector<float> latents,
                            std::vector<float> keys) const {
  const int64_t n = static_cast<int64_t>(latents.size()) / hd;
  if (n == 0) return;
  const AttentionWeights& a = layers[l].attn;
  const int64_t Id = c.index_head_dim;
  if (keys.empty()) keys = Linear(latents, n, a.i_wk);  // from the RoPE-free latents
  KVC_CHECK(static_cast<int64_t>(keys.size()) == n * Id)
      << "layer " << l << ": keys for " << keys.size() / Id << " of " << n;
  for (int64_t e = 0; e < n; ++e)
    EmitEntry(s, l, std::span<float>(latents.data() + e * hd, hd),
              std::span<float>(keys.data() + e * Id, Id));
}

void ModelImpl::EmitEntry(SequenceState& s, int64_t l, std::span<float> latent,
                          std::span<float> k) const {
  LayerState& ls = s.layers[l];
  const AttentionWeights& a = layers[l].attn;
  const int64_t ratio = sched.layers[l].compress_ratio, Id = c.index_head_dim;
  const int64_t j = ls.entries;
  const int64_t pos = j * ratio;
  // The index key normalized and rotated, the latent rotated; both quantized straight into
  // the page (the float copies are their dequantized values).
  cpu::RmsNorm(k.data(), a.i_k_norm.data(), Id, c.rms_norm_eps, k.data());
  cpu::ApplyRope(k.data(), Id, freqs[l], pos);
  cpu::ApplyRope(latent.data(), hd, freqs[l], pos);
  const int64_t chunk = pos / layout.chunk_tokens;
  std::vector<uint8_t>& page = s.WritePage(chunk, layout.chunk_bytes);
  const int64_t local = j - chunk * (layout.chunk_tokens / ratio);
  const ChunkSection& mc = layout.Section(l, SectionKind::kMainCodes);
  const ChunkSection& ms = layout.Section(l, SectionKind::kMainScales);
  const ChunkSection& ic = layout.Section(l, SectionKind::kIndexCodes);
  const ChunkSection& is = layout.Section(l, SectionKind::kIndexScales);
  const int64_t mcb = CodesBytes(KvFormat::kMainKv, hd), msb = ScalesBytes(KvFormat::kMainKv, hd);
  const int64_t icb = CodesBytes(KvFormat::kIndexK, Id), isb = ScalesBytes(KvFormat::kIndexK, Id);
  std::span<uint8_t> pg(page);
  Quantize(KvFormat::kMainKv, latent, pg.subspan(mc.offset + local * mcb, mcb),
           pg.subspan(ms.offset + local * msb, msb));
  Quantize(KvFormat::kIndexK, k, pg.subspan(ic.offset + local * icb, icb),
           pg.subspan(is.offset + local * isb, isb));
  ls.main_f.resize((j + 1) * hd);
  ls.index_f.resize((j + 1) * Id);
  Dequantize(KvFormat::kMainKv, pg.subspan(mc.offset + local * mcb, mcb),
             pg.subspan(ms.offset + local * msb, msb),
             std::span<float>(ls.main_f.data() + j * hd, hd));
  Dequantize(KvFormat::kIndexK, pg.subspan(ic.offset + local * icb, icb),
             pg.subspan(is.offset + local * isb, isb),
             std::span<float>(ls.index_f.data() + j * Id, Id));
  ++ls.entries;
}

void ModelImpl::CompressorCalls(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                                const std::vector<float>& x, CompressorInput& in,
                                std::vector<GemmCall>& calls) const {
  const LayerState& ls = s.layers[l];
  const AttentionWeights& w = layers[l].attn;
  const int64_t ratio = sched.layers[l].compress_ratio;
  const int64_t done = ls.entries * ratio + ls.pend_rows;  // positions already consumed
  in.first = std::max(a, done);
  in.rows = std::max<int64_t>(0, b - in.first);
  if (in.rows == 0) return;
  KVC_CHECK(in.first == done) << "layer " << l << ": compressor gap at " << done;
  const float* xs = x.data() + (in.first - a) * D;
  in.kv.resize(in.rows * w.c_wkv.out_features());
  const int64_t kv_call = static_cast<int64_t>(calls.size());
  calls.push_back({xs, in.rows, &w.c_wkv, in.kv.data()});
  if (ratio == 1) {  // each row an entry: its latent is the row normalized
    in.keys.resize(in.rows * w.i_wk.out_features());
    calls.push_back(
        {nullptr, in.rows, &w.i_wk, in.keys.data(), kv_call, w.c_norm.data(), c.rms_norm_eps});
  }
  if (ratio > 1) {
    in.score.resize(in.rows * w.c_wgate.out_features());
    calls.push_back({xs, in.rows, &w.c_wgate, in.score.data()});
  }
}

void ModelImpl::Compress(SequenceState& s, int64_t l, int64_t a, int64_t b,
                         const std::vector<float>& x) const {
  CompressorInput in;
  std::vector<GemmCall> calls;
  CompressorCalls(s, l, a, b, x, in, calls);
  mm->GemmGroup(calls);
  Compress(s, l, in);
}

void ModelImpl::Compress(SequenceState& s, int64_t l, const CompressorInput& in) const {
  LayerState& ls = s.layers[l];
  const AttentionWeights& w = layers[l].attn;
  const int64_t ratio = sched.layers[l].compress_ratio, rows = in.rows;
  const std::vector<float>&kv = in.kv, &score = in.score;
  std::vector<float> latents;  // the pass's new entries, emitted together
  for (int64_t r = 0; r < rows; ++r) {
    if (ratio == 1) {
      latents.insert(latents.end(), kv.begin() + r * hd, kv.begin() + (r + 1) * hd);
      float* latent = latents.data() + latents.size() - hd;
      cpu::RmsNorm(latent, w.c_norm.data(), hd, c.rms_norm_eps, latent);  // as the keys' input
      continue;
    }
    ls.pend_kv.insert(ls.pend_kv.end(), kv.begin() + r * hd, kv.begin() + (r + 1) * hd);
    ls.pend_score.insert(ls.pend_score.end(), score.begin() + r * hd, score.begin() + (r + 1) * hd);
    if (++ls.pend_rows < ratio) continue;
    // Softmax over the group's tokens per channel, then the weighted sum.
    std::vector<float> latent = PoolGroup(ls.pend_kv.data(), ls.pend_score.data(), ratio, hd);
    cpu::RmsNorm(latent.data(), w.c_norm.data(), hd, c.rms_norm_eps, latent.data());
    ls.pend_kv.clear();
    ls.pend_score.clear();
    ls.pend_rows = 0;
    latents.insert(latents.end(), latent.begin(), latent.end());
  }
  EmitEntries(s, l, std::move(latents), ratio == 1 ? in.keys : std::vector<float>());
}

void ModelImpl::QueriesAndWindowKv(int64_t l, int64_t a, int64_t rows, const std::vector<float>& x,
                                   std::vector<float>& q, std::vector<float>& kv,
                                   std::vector<float>* qi, std::vector<float>* wts,
                                   std::span<const GemmCall> also) const {
  const AttentionWeights& w = layers[l].attn;
  // qr (rows × q_lora_rank), kv (rows × hd), then from qr RMS-normalized: q (rows × H ×
  // hd) and the indexer's qi (rows × IH × Id); wts from x.
  std::vector<float> qr(rows * w.wq_a.out_features());
  kv.resize(rows * w.wkv.out_features());
  q.resize(rows * w.wq_b.out_features());
  std::vector<GemmCall> calls = {
      {x.data(), rows, &w.wq_a, qr.data()},
      {x.data(), rows, &w.wkv, kv.data()},
      {nullptr, rows, &w.wq_b, q.data(), /*input_of=*/0, w.q_norm.data(), c.rms_norm_eps}};
  if (qi != nullptr) {
    qi->resize(rows * w.i_wq_b.out_features());
    wts->resize(rows * w.i_weights.out_features());
    calls.push_back(
        {nullptr, rows, &w.i_wq_b, qi->data(), /*input_of=*/0, w.q_norm.data(), c.rms_norm_eps});
    calls.push_back({x.data(), rows, &w.i_weights, wts->data()});
  }
  AppendToGroup(calls, also);
  mm->GemmGroup(calls);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < H; ++h) cpu::ApplyRope(&q[(r * H + h) * hd], hd, freqs[l], a + r);
    float* k = &kv[r * hd];
    cpu::RmsNorm(k, w.kv_norm.data(), hd, c.rms_norm_eps, k);
    cpu::ApplyRope(k, hd, freqs[l], a + r);
    FakeQuantize(KvFormat::kSwaKv, std::span<float>(k, hd));
  }
}

void ModelImpl::Attention(SequenceState& s, int64_t l, int64_t a, int64_t b,
                          const std::vector<float>& x, bool compress, std::vector<float>& out,
                          std::map<int64_t, std::vector<std::vector<int32_t>>>& topk,
                          std::vector<std::vector<uint8_t>>& pool,
                          std::span<const GemmCall> also) const {
  const LayerPlan& plan = sched.layers[l];
  LayerState& ls = s.layers[l];
  const int64_t rows = b - a, ratio = plan.compress_ratio;
  const bool runs_indexer = ratio > 0 && plan.runs_indexer();
  std::vector<float> q, kv, qi, wts;
  CompressorInput compressor;
  std::vector<GemmCall> others(also.begin(), also.end());  // with the query path's group
  const bool compresses = ratio > 0 && plan.mode == AttentionMode::kFull && compress;
  if (compresses) CompressorCalls(s, l, a, b, x, compressor, others);
  QueriesAndWindowKv(l, a, rows, x, q, kv, runs_indexer ? &qi : nullptr,
                     runs_indexer ? &wts : nullptr, others);
  // Compressed KV and each query's selection of it.
  std::vector<std::vector<int32_t>>* selected = nullptr;
  const LayerState* kv_src = nullptr;
  if (ratio > 0) {
    if (compresses) Compress(s, l, compressor);
    kv_src = &s.layers[plan.kv_layer];
    if (runs_indexer) {
      const int64_t IH = c.index_n_heads, Id = c.index_head_dim;
      const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Id)) /
                                              std::sqrt(static_cast<double>(IH)));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t h = 0; h < IH; ++h) {
          float* qh = &qi[(r * IH + h) * Id];
          cpu::ApplyRope(qh, Id, freqs[l], a + r);
          FakeQuantize(KvFormat::kIndexK, std::span<float>(qh, Id));
        }
        for (int64_t h = 0; h < IH; ++h) wts[r * IH + h] *= wscale;
      }
      const LayerState& ks = s.layers[plan.index_k_layer];
      auto& sel = topk[l];
      sel.assign(rows, {});
      const int64_t max_cl = b / ratio;
      KVC_CHECK(max_cl <= ks.entries)
          << "layer " << l << " needs " << max_cl << " index keys, has " << ks.entries;
      IndexerBatch ib;
      ib.queries = rows;
      ib.heads = IH;
      ib.dim = Id;
      ib.qi = qi.data();
      ib.w = wts.data();
      ib.first_position = a;
      ib.ratio = ratio;
      ib.keys = ks.index_f.data();
      ib.key_rows = ks.entries;
      ib.pages = s.pages;
      ib.page_versions = s.page_versions;
      ib.sequence = s.id;
      ib.layout = &layout;
      ib.layer = plan.index_k_layer;
      ib.topk = c.index_topk;
      ib.block = c.candidate_block_size;
      ib.topk_blocks = c.candidate_topk_blocks;
      ib.pool = &pool;
      ib.selected = &sel;
      ib.matmul = mm.get();
      if (plan.is_candidate_source) {
        ib.pool_use = PoolUse::kProduce;
        pool.assign(rows, {});
      } else if (plan.candidate_pool_layer >= 0) {
        ib.pool_use = PoolUse::kApply;
      }
      indexer->Select(ib);
      selected = &sel;
    } else {
      selected = &topk.at(plan.topk_layer);
    }
  }
  // Each query attends its window and its selected compressed rows. The window rows:
  // the ring (slot p % win holds position p), then this pass's own rows.
  std::vector<float> window(ls.ring);
  window.insert(window.end(), kv.begin(), kv.end());
  std::vector<int32_t> offsets = {0}, entries;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = a + r;
    for (int64_t p = std::max(ls.window_start, i - win + 1); p <= i; ++p) {
      if (p >= a) {
        entries.push_back(static_cast<int32_t>(win + (p - a)));
      } else {
        KVC_CHECK(ls.ring_pos[p % win] == p) << "layer " << l << ": window row " << p << " missing";
        entries.push_back(static_cast<int32_t>(p % win));
      }
    }
    if (selected != nullptr) {
      for (int32_t j : (*selected)[r]) entries.push_back(-j - 1);
    }
    offsets.push_back(static_cast<int32_t>(entries.size()));
  }
  AttentionBatch batch;
  batch.window = window;
  batch.offsets = offsets;
  batch.entries = entries;
  if (selected != nullptr) {
    batch.compressed = kv_src->main_f.data();
    batch.pages = s.pages;
    batch.page_versions = s.page_versions;
    batch.sequence = s.id;
    batch.layout = &layout;
    batch.layer = plan.kv_layer;
  }
  AttendAndProject(l, a, rows, q, batch, out);
  // The window ring keeps the last `win` rows of this pass.
  for (int64_t p = std::max(a, b - win); p < b; ++p) {
    std::copy(kv.begin() + (p - a) * hd, kv.begin() + (p - a + 1) * hd,
              ls.ring.begin() + (p % win) * hd);
    ls.ring_pos[p % win] = p;
  }
}

void ModelImpl::AttendAndProject(int64_t l, int64_t a, int64_t rows, const std::vector<float>& q,
                                 AttentionBatch batch, std::vector<float>& out) const {
  const AttentionWeights& w = layers[l].attn;
  // Sparse MQA: the same row is key and value; the sink enters the denominator only.
  batch.queries = rows;
  batch.heads = H;
  batch.dim = hd;
  batch.q = q.data();
  batch.sink = w.sink.data();
  batch.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  // A device backend may run the whole path below where the attention output already is.
  OutputPath path;
  path.first_position = a;
  path.rope_freqs = &freqs[l];
  path.wo_a = w.wo_a;
  path.wo_b = &w.wo_b;
  path.matmul = mm.get();
  out.resize(rows * w.wo_b.out_features());
  if (attn->AttendAndProject(batch, path, out.data())) return;
  std::vector<float> o(rows * H * hd);
  batch.out = o.data();
  attn->Attend(batch);
  cpu::ThreadPool::Default().ParallelFor(rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t h = 0; h < H; ++h)
        cpu::ApplyRope(&o[(r * H + h) * hd], hd, freqs[l], a + r, /*inverse=*/true);
    }
  });
  // Grouped low-rank output.
  const int64_t G = c.o_groups, gw = H * hd / G, ol = c.o_lora_rank;
  std::vector<float> u(rows * G * ol);
  std::vector<std::vector<float>> og(G, std::vector<float>(rows * gw)),
      ug(G, std::vector<float>(rows * ol));
  std::vector<GemmCall> calls;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy(o.begin() + r * H * hd + g * gw, o.begin() + r * H * hd + (g + 1) * gw,
                og[g].begin() + r * gw);
    calls.push_back({og[g].data(), rows, &w.wo_a[g], ug[g].data()});
  }
  mm->GemmGroup(calls);  // the groups' products together: one wait on a device
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy(ug[g].begin() + r * ol, ug[g].begin() + (r + 1) * ol,
                u.begin() + r * G * ol + g * ol);
  }
  out = Linear(u, rows, w.wo_b);
}

void ModelImpl::DraftAttention(SequenceState& s, int64_t l, int64_t a, int64_t b,
                               const std::vector<float>& x, std::vector<float>& out,
                               std::span<const GemmCall> also) const {
  const LayerState& ls = s.layers[l];
  const int64_t rows = b - a;
  std::vector<float> q, kv;  // kv: the draft block's own rows, never stored
  QueriesAndWindowKv(l, a, rows, x, q, kv, nullptr, nullptr, also);
  // Every draft query sees the main model's window (accepted positions, from the ring, in
  // position order) and the whole draft block: attention inside the block is bidirectional.
  std::vector<float> window(ls.ring);
  window.insert(window.end(), kv.begin(), kv.end());
  std::vector<int32_t> shared;
  for (int64_t p = std::max<int64_t>(0, a - win); p < a; ++p) {
    if (ls.ring_pos[p % win] == p) shared.push_back(static_cast<int32_t>(p % win));
  }
  for (int64_t r = 0; r < rows; ++r) shared.push_back(static_cast<int32_t>(win + r));
  std::vector<int32_t> offsets = {0}, entries;
  for (int64_t r = 0; r < rows; ++r) {
    entries.insert(entries.end(), shared.begin(), shared.end());
    offsets.push_back(static_cast<int32_t>(entries.size()));
  }
  AttentionBatch batch;
  batch.window = window;
  batch.offsets = offsets;
  batch.entries = entries;
  AttendAndProject(l, a, rows, q, batch, out);
}

void ModelImpl::UpdateDraftRings(SequenceState& s, int64_t a, int64_t b,
                                 const std::vector<float>& main_hidden) const {
  if (ND == 0) return;
  const int64_t first = std::max(a, b - win), rows = b - first;
  const int64_t width = static_cast<int64_t>(targets.size()) * D;
  std::vector<float> mh(main_hidden.begin() + (first - a) * width, main_hidden.end());
  std::vector<float> mx = Linear(mh, rows, draft.main_proj);
  NormRows(mx, rows, D, draft.main_norm, c.rms_norm_eps);
  for (int64_t l = L; l < L + ND; ++l) {
    const AttentionWeights& w = layers[l].attn;
    LayerState& ls = s.layers[l];
    std::vector<float> kv = Linear(mx, rows, w.wkv);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = first + r;
      float* k = &kv[r * hd];
      cpu::RmsNorm(k, w.kv_norm.data(), hd, c.rms_norm_eps, k);
      cpu::ApplyRope(k, hd, freqs[l], p);
      FakeQuantize(KvFormat::kSwaKv, std::span<float>(k, hd));
      std::copy(k, k + hd, ls.ring.begin() + (p % win) * hd);
      ls.ring_pos[p % win] = p;
    }
  }
}

void ModelImpl::Moe(int64_t l, const std::vector<float>& x, int64_t rows, std::vector<float>& out,
                    std::span<const GemmCall> also) const {
  const LayerWeights& w = layers[l];
  const int64_t E_ = static_cast<int64_t>(w.experts.size()), k = w.experts_per_token,
                I = c.moe_intermediate_size;
  const float limit = static_cast<float>(c.swiglu_limit);
  std::vector<float> logits(rows * w.gate.out_features());
  std::vector<GemmCall> gate = {{x.data(), rows, &w.gate, logits.data()}};
  AppendToGroup(gate, also);
  mm->GemmGroup(gate);
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(E_);  // (row, weight)
  for (int64_t r = 0; r < rows; ++r) {
    for (const auto& [e, weight] : RouteToken(Row(logits, r, E_), w.gate_bias, k, c.norm_topk_prob,
                                              static_cast<float>(c.routed_scaling_factor))) {
      by_expert[e].push_back({r, weight});
    }
  }
  // The routed experts that got rows, in id order, then the shared one over every row.
  // Their products go to the backend in groups (gate and up projections, then the down
  // projections) so a device backend launches a group's experts together; groups hold at
  // most kGroupRows rows to bound the intermediates. Results do not depend on grouping.
  struct Job {
    const ExpertWeights* ew = nullptr;
    std::vector<int64_t> rows;  // empty: every row (the shared expert)
    std::vector<float> xs, weights, g, up, y;
  };
  std::vector<Job> jobs;
  for (int64_t e = 0; e < E_; ++e) {
    const auto& members = by_expert[e];
    if (members.empty()) continue;
    Job& j = jobs.emplace_back();
    j.ew = &w.experts[e];
    const int64_t n = static_cast<int64_t>(members.size());
    j.xs.resize(n * D);
    for (int64_t m = 0; m < n; ++m) {
      j.rows.push_back(members[m].first);
      j.weights.push_back(members[m].second);
      std::copy(x.begin() + members[m].first * D, x.begin() + (members[m].first + 1) * D,
                j.xs.begin() + m * D);
    }
  }
  out.assign(rows * D, 0.0f);
  constexpr int64_t kGroupRows = 8192;
  auto run_group = [&](std::span<Job> group) {
    std::vector<GemmCall> calls;
    for (Job& j : group) {
      const int64_t n = j.rows.empty() ? rows : static_cast<int64_t>(j.rows.size());
      const float* xs = j.rows.empty() ? x.data() : j.xs.data();
      j.g.resize(n * I);
      j.up.resize(n * I);
      calls.push_back({xs, n, &j.ew->w1, j.g.data()});
      calls.push_back({xs, n, &j.ew->w3, j.up.data()});
    }
    mm->GemmGroup(calls);
    calls.clear();
    for (Job& j : group) {
      const int64_t n = j.rows.empty() ? rows : static_cast<int64_t>(j.rows.size());
      for (int64_t r = 0; r < n; ++r) {
        const float weight = j.rows.empty() ? 1.0f : j.weights[r];
        for (int64_t i = 0; i < I; ++i) {
          const float gi = std::min(j.g[r * I + i], limit);
          const float ui = std::clamp(j.up[r * I + i], -limit, limit);
          j.g[r * I + i] = weight * cpu::Silu(gi) * ui;
        }
      }
      j.y.resize(n * D);
      calls.push_back({j.g.data(), n, &j.ew->w2, j.y.data()});
    }
    mm->GemmGroup(calls);
    for (Job& j : group) {  // in job order: routed experts by id, the shared one last
      if (j.rows.empty()) {
        for (int64_t i = 0; i < rows * D; ++i) out[i] += j.y[i];
      } else {
        for (size_t m = 0; m < j.rows.size(); ++m) {
          for (int64_t i = 0; i < D; ++i) out[j.rows[m] * D + i] += j.y[m * D + i];
        }
      }
      j = Job();  // free its intermediates
    }
  };
  Job& shared = jobs.emplace_back();
  shared.ew = &w.shared;
  for (size_t first = 0; first < jobs.size();) {
    size_t last = first;
    int64_t n = 0;
    do {
      n += jobs[last].rows.empty() ? rows : static_cast<int64_t>(jobs[last].rows.size());
      ++last;
    } while (last < jobs.size() && n < kGroupRows);
    run_group(std::span(jobs).subspan(first, last - first));
    first = last;
  }
}

void ModelImpl::RunLayers(SequenceState& s, int64_t l0, int64_t l1, int64_t a, int64_t b,
                          std::vector<float>& X, std::vector<float>& pre, bool compress,
                          std::vector<float>* main_hidden) const {
  const int64_t rows = b - a, mix = (2 + hc) * hc;
  std::map<int64_t, std::vector<std::vector<int32_t>>> topk;
  std::vector<std::vector<uint8_t>> pool;
  std::vector<float> xin(rows * D), y, R;
  std::vector<cpu::HcCoefficients> coef(rows);
  std::vector<float> a1(rows * hc);
  // The mixes of one sublayer for every row: m = (fn · vec X) · rsqrt(mean(vec X²) + 1e-20).
  // The product fn · vec X needs only X, and the sublayer's input mixes with the previous
  // sublayer's coefficients, so it goes with the sublayer's first group of products (one
  // wait fewer on a device); `coefficients` finishes once that group is done, before X
  // changes.
  std::vector<float> mixes(rows * mix);
  auto mixes_product = [&](const LayerWeights& w, int sub) {
    return GemmCall{X.data(), rows, &w.hc_fn[sub], mixes.data()};
  };
  auto coefficients = [&](const LayerWeights& w, int sub) {
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < hc * D; ++i)
        ss += static_cast<double>(X[r * hc * D + i]) * X[r * hc * D + i];
      const float rs =
          static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hc * D) + 1e-20));
      for (int64_t j = 0; j < mix; ++j) mixes[r * mix + j] *= rs;
      coef[r] = cpu::HcFromMixes(Row(mixes, r, mix), w.hc_base[sub], w.hc_scale[sub], hc,
                                 c.hc_sinkhorn_iters, c.hc_eps);
    }
  };
  for (int64_t l = l0; l < l1; ++l) {
    const LayerWeights& w = layers[l];
    if (w.engram) ApplyEngram(s, l, a, b, X);
    if (main_hidden != nullptr && l < L && sched.layers[l].is_dspark_target) {
      const int64_t t = std::find(targets.begin(), targets.end(), l) - targets.begin();
      const int64_t width = static_cast<int64_t>(targets.size()) * D;
      main_hidden->resize(rows * width);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < D; ++i) {
          float m = 0.0f;
          for (int64_t k = 0; k < hc; ++k) m += X[(r * hc + k) * D + i];
          (*main_hidden)[r * width + t * D + i] = m / static_cast<float>(hc);
        }
      }
    }
    // Attention sublayer: its input mixes with the previous sublayer's coefficients.
    R = X;
    for (int64_t r = 0; r < rows; ++r) {
      cpu::HcPre(&X[r * hc * D], &pre[r * hc], hc, D, &xin[r * D]);
      cpu::RmsNorm(&xin[r * D], w.attn_norm.data(), D, c.rms_norm_eps, &xin[r * D]);
    }
    const GemmCall attn_mixes = mixes_product(w, 0);
    if (l < L) {
      Attention(s, l, a, b, xin, compress, y, topk, pool, std::span(&attn_mixes, 1));
    } else {
      DraftAttention(s, l, a, b, xin, y, std::span(&attn_mixes, 1));
    }
    coefficients(w, 0);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(coef[r].pre.begin(), coef[r].pre.end(), a1.begin() + r * hc);
      cpu::HcPost(&y[r * D], &R[r * hc * D], coef[r], hc, D, &X[r * hc * D]);
    }
    // MoE sublayer.
    R = X;
    for (int64_t r = 0; r < rows; ++r) {
      cpu::HcPre(&X[r * hc * D], &a1[r * hc], hc, D, &xin[r * D]);
      cpu::RmsNorm(&xin[r * D], w.ffn_norm.data(), D, c.rms_norm_eps, &xin[r * D]);
    }
    const GemmCall ffn_mixes = mixes_product(w, 1);
    Moe(l, xin, rows, y, std::span(&ffn_mixes, 1));
    coefficients(w, 1);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::HcPost(&y[r * D], &R[r * hc * D], coef[r], hc, D, &X[r * hc * D]);
      std::copy(coef[r].pre.begin(), coef[r].pre.end(), pre.begin() + r * hc);
    }
  }
}

void ModelImpl::CompressDecoder(SequenceState& s, int64_t a, int64_t b, std::vector<float> X,
                                const std::vector<float>& pre) const {
  const int64_t l = decoder_full;
  if (layers[l].engram) ApplyEngram(s, l, a, b, X);
  const int64_t rows = b - a;
  std::vector<float> xin(rows * D);
  for (int64_t r = 0; r < rows; ++r) {
    cpu::HcPre(&X[r * hc * D], &pre[r * hc], hc, D, &xin[r * D]);
    cpu::RmsNorm(&xin[r * D], layers[l].attn_norm.data(), D, c.rms_norm_eps, &xin[r * D]);
  }
  Compress(s, l, a, b, xin);
}

std::vector<float> ModelImpl::Logits(const std::vector<float>& X, const std::vector<float>& pre,
                                     int64_t row, const std::vector<float>* final_norm) const {
  std::vector<float> x(D), logits(c.vocab_size);
  cpu::HcPre(&X[row * hc * D], &pre[row * hc], hc, D, x.data());
  cpu::RmsNorm(x.data(), (final_norm ? final_norm : &norm)->data(), D, c.rms_norm_eps, x.data());
  mm->Gemm(x.data(), 1, head, logits.data());
  return logits;
}

// ---- public API ----

Model::Model(std::unique_ptr<ModelImpl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
const ModelConfig& Model::config() const { return impl_->c; }
const LayerSchedule& Model::schedule() const { return impl_->sched; }
const ChunkLayout& Model::layout() const { return impl_->layout; }

void ModelImpl::ForEachWeight(const std::function<void(const PackedMatrix&)>& fn) const {
  auto each = [&](const PackedMatrix& w) {
    if (w.out_features() > 0) fn(w);
  };
  each(head);
  for (const LayerWeights& w : layers) {
    for (const PackedMatrix& h : w.hc_fn) each(h);
    const AttentionWeights& a = w.attn;
    for (const PackedMatrix* p : {&a.wq_a, &a.wq_b, &a.wkv, &a.wo_b, &a.c_wkv, &a.c_wgate, &a.i_wk,
                                  &a.i_wq_b, &a.i_weights, &w.gate}) {
      each(*p);
    }
    for (const PackedMatrix& g : a.wo_a) each(g);
    for (const ExpertWeights& e : w.experts) {
      each(e.w1), each(e.w3), each(e.w2);
    }
    each(w.shared.w1), each(w.shared.w3), each(w.shared.w2);
    if (w.engram) each(w.engram->wkv);
  }
  each(draft.main_proj), each(draft.markov_head);
}

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
  m->c = config;
  absl::StatusOr<LayerSchedule> sched = BuildLayerSchedule(config);
  if (!sched.ok()) return sched.status();
  m->sched = *std::move(sched);
  absl::StatusOr<ChunkLayout> layout = BuildChunkLayout(config, m->sched, chunk_tokens);
  if (!layout.ok()) return layout.status();
  m->layout = *std::move(layout);
  m->D = config.hidden_size;
  m->H = config.num_attention_heads;
  m->hd = config.head_dim;
  m->rd = config.qk_rope_head_dim;
  m->hc = config.hc_mult;
  m->win = config.sliding_window;
  m->E = m->sched.encoder_layers;
  m->L = config.num_hidden_layers;
  m->ND = config.num_nextn_predict_layers;
  m->targets = config.dspark_target_layer_ids;
  // What this engine supports, checked up front with the key that breaks it.
  if ((m->H * m->hd) % config.o_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads × head_dim (", m->H * m->hd,
                                                   ") is not divisible by o_groups ",
                                                   config.o_groups));
  }
  if (m->hd % 32 != 0 || config.index_head_dim % 32 != 0) {
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
  for (int64_t l = m->E; l < m->L; ++l) {
    if (m->sched.layers[l].mode != AttentionMode::kFull) continue;
    if (m->decoder_full >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers ", m->decoder_full, " and ", l,
                       " are both Full decoder layers; CED computes one decoder global KV"));
    }
    m->decoder_full = l;
  }
  if (m->decoder_full != m->E) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the first decoder layer (", m->E, ") must be the decoder's only Full layer (CED)"));
  }
  for (int64_t l = 0; l < m->L + m->ND; ++l) {
    const bool compressed = config.compress_ratios[l] > 0;
    m->freqs.push_back(cpu::RopeFrequencies(
        m->rd, compressed ? config.compress_rope_theta : config.rope_theta,
        compressed ? config.rope_scaling.original_max_position_embeddings : 0,
        config.rope_scaling.factor, config.rope_scaling.beta_fast, config.rope_scaling.beta_slow));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(weights_path);
  if (!f.ok()) return f.status();
  if (absl::Status s = m->LoadWeights(**f); !s.ok()) return s;
  m->ForEachWeight([&](const PackedMatrix& w) { m->mm->Register(w); });
  return std::unique_ptr<Model>(new Model(std::move(m)));
}

Sequence Model::NewSequence() const { return Sequence(impl_->NewState()); }

namespace {

void UpdateFullTokens(const ModelImpl& m, SequenceState& s) {
  int64_t full = std::numeric_limits<int64_t>::max();
  for (int64_t l = 0; l < m.L; ++l) {
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
  if (absl::Status st = m.CheckTokens(tokens); !st.ok()) return st;
  const int64_t n = static_cast<int64_t>(tokens.size());
  s.tokens.assign(tokens.begin(), tokens.end());
  s.stats = {};
  std::vector<float> pre;
  std::vector<float> X = m.Embed(s, 0, n, &pre);
  std::vector<float> main_hidden;
  if (mode == PrefillMode::kFullDepth) {
    m.RunLayers(s, 0, m.L, 0, n, X, pre, /*compress=*/true, &main_hidden);
    m.UpdateDraftRings(s, 0, n, main_hidden);
    s.stats.encoder_tokens = s.stats.decoder_tokens = n;
    UpdateFullTokens(m, s);
    return m.Logits(X, pre, n - 1);
  }
  m.RunLayers(s, 0, m.E, 0, n, X, pre, /*compress=*/true);
  m.CompressDecoder(s, 0, n, X, pre);
  const int64_t seg = std::max<int64_t>(0, n - m.win);
  for (int64_t l = m.E; l < m.L; ++l) s.layers[l].window_start = seg;
  std::vector<float> Xs(X.begin() + seg * m.hc * m.D, X.end());
  std::vector<float> ps(pre.begin() + seg * m.hc, pre.end());
  m.RunLayers(s, m.E, m.L, seg, n, Xs, ps, /*compress=*/false, &main_hidden);
  m.UpdateDraftRings(s, seg, n, main_hidden);
  s.stats.encoder_tokens = n;
  s.stats.compressed_tokens = n;
  s.stats.decoder_tokens = n - seg;
  UpdateFullTokens(m, s);
  return m.Logits(Xs, ps, n - seg - 1);
}

std::vector<std::vector<float>> ModelImpl::Extend(SequenceState& s,
                                                  std::span<const uint32_t> tokens) const {
  const int64_t p = static_cast<int64_t>(s.tokens.size()), k = static_cast<int64_t>(tokens.size());
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  std::vector<float> pre, main_hidden;
  std::vector<float> X = Embed(s, p, p + k, &pre);
  RunLayers(s, 0, L, p, p + k, X, pre, /*compress=*/true, &main_hidden);
  UpdateDraftRings(s, p, p + k, main_hidden);
  s.stats = {
      .encoder_tokens = k, .decoder_tokens = k, .replayed_tokens = 0, .compressed_tokens = k};
  UpdateFullTokens(*this, s);
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < k; ++r) out.push_back(Logits(X, pre, r));
  return out;
}

absl::StatusOr<std::vector<float>> Model::Decode(Sequence& seq, uint32_t token) const {
  absl::StatusOr<std::vector<std::vector<float>>> l = Extend(seq, std::span(&token, 1));
  if (!l.ok()) return l.status();
  return std::move((*l)[0]);
}

absl::StatusOr<std::vector<std::vector<float>>> Model::Extend(
    Sequence& seq, std::span<const uint32_t> tokens) const {
  const ModelImpl& m = *impl_;
  SequenceState& s = *seq.s_;
  if (s.tokens.empty()) return absl::FailedPreconditionError("Decode needs a prefilled sequence");
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to run");
  if (absl::Status st = m.CheckTokens(tokens); !st.ok()) return st;
  return m.Extend(s, tokens);
}

bool Model::has_drafter() const { return impl_->ND > 0; }

absl::StatusOr<std::vector<uint32_t>> Model::Draft(Sequence& seq, uint32_t next) const {
  const ModelImpl& m = *impl_;
  SequenceState& s = *seq.s_;
  if (m.ND == 0) return absl::FailedPreconditionError("the config has no DSpark draft layers");
  if (s.tokens.empty()) return absl::FailedPreconditionError("Draft needs a prefilled sequence");
  if (absl::Status st = m.CheckTokens(std::span(&next, 1)); !st.ok()) return st;
  const int64_t B = m.c.dspark_block_size, a = static_cast<int64_t>(s.tokens.size());
  // The block: the next token, then noise placeholders, at the positions after it.
  std::vector<float> X(B * m.hc * m.D), pre(B * m.hc, 0.0f);
  for (int64_t r = 0; r < B; ++r) {
    const uint32_t id = r == 0 ? next : static_cast<uint32_t>(m.c.dspark_noise_token_id);
    const float* e = m.embed.data() + static_cast<int64_t>(id) * m.D;
    for (int64_t k = 0; k < m.hc; ++k) std::copy(e, e + m.D, X.data() + (r * m.hc + k) * m.D);
    pre[r * m.hc] = 1.0f;
  }
  m.RunLayers(s, m.L, m.L + m.ND, a, a + B, X, pre, /*compress=*/false);
  // Row i proposes the token after position a + i, with the Markov head's bigram bias from
  // the token before it (the real next token for row 0, then the drafts).
  std::vector<uint32_t> drafts;
  uint32_t prev = next;
  const int64_t rank = m.c.dspark_markov_rank;
  std::vector<float> bias(m.c.vocab_size);
  for (int64_t r = 0; r < B; ++r) {
    std::vector<float> logits = m.Logits(X, pre, r, &m.draft.norm);
    m.mm->Gemm(m.draft.markov_embed.data() + static_cast<int64_t>(prev) * rank, 1,
               m.draft.markov_head, bias.data());
    for (int64_t v = 0; v < m.c.vocab_size; ++v) logits[v] += bias[v];
    prev = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    drafts.push_back(prev);
  }
  return drafts;
}

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
    const SequenceCheckpoint::Layer& c = cp.layers_[l];
    ls.ring = c.ring;
    ls.ring_pos = c.ring_pos;
    ls.pend_kv = c.pend_kv;
    ls.pend_score = c.pend_score;
    ls.pend_rows = c.pend_rows;
    // Rows emitted after the checkpoint are dropped; their page bytes are rewritten when
    // the positions are compressed again.
    ls.entries = c.entries;
    ls.main_f.resize(c.entries * impl_->hd);
    ls.index_f.resize(c.entries * impl_->c.index_head_dim);
  }
}

absl::StatusOr<std::vector<float>> Model::Resume(Sequence& seq, std::span<const uint8_t> pages,
                                                 int64_t cached, std::span<const uint32_t> tokens,
                                                 ReplayMode replay) const {
  return Resume(
      seq, [pages]() -> absl::StatusOr<std::span<const uint8_t>> { return pages; }, cached, tokens,
      replay);
}

absl::StatusOr<std::vector<float>> Model::Resume(Sequence& seq, const PageSource& source,
                                                 int64_t cached, std::span<const uint32_t> tokens,
                                                 ReplayMode replay) const {
  const ModelImpl& m = *impl_;
  SequenceState& s = *seq.s_;
  const int64_t C = m.layout.chunk_tokens, n = static_cast<int64_t>(tokens.size());
  if (!s.tokens.empty()) return absl::FailedPreconditionError("Resume needs an empty sequence");
  if (replay == ReplayMode::kExact && !m.mm->batch_invariant()) {
    return absl::FailedPreconditionError(
        absl::StrCat("exact replay needs a batch-invariant matmul backend; \"", m.mm->name(),
                     "\" gives a row other bits in calls of other heights (use bounded replay)"));
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
  if (absl::Status st = m.CheckTokens(tokens); !st.ok()) return st;
  s.tokens.assign(tokens.begin(), tokens.end());
  s.stats = {};
  // Replay start: the model's window, or the encoder's whole dependency window before the
  // first position the decoder reads (exact).
  const int64_t seg = std::max<int64_t>(0, n - m.win);
  int64_t start = std::max<int64_t>(0, cached - m.win);
  if (replay == ReplayMode::kExact) {
    start = std::max<int64_t>(0, std::min(cached, seg) - m.E * m.win);
  }
  for (int64_t l = 0; l < m.E; ++l) s.layers[l].window_start = start;
  for (int64_t l = m.E; l < m.L; ++l) s.layers[l].window_start = seg;
  std::vector<float> pre;
  std::vector<float> X = m.Embed(s, start, n, &pre);
  // The layers before the first compressed one read no page: they run while the pages
  // are still on their way.
  int64_t early = 0;
  while (early < m.E && m.sched.layers[early].compress_ratio == 0) ++early;
  m.RunLayers(s, 0, early, start, n, X, pre, /*compress=*/true);
  absl::StatusOr<std::span<const uint8_t>> got = source();
  if (!got.ok()) return got.status();
  const std::span<const uint8_t> pages = *got;
  if (static_cast<int64_t>(pages.size()) != chunks * m.layout.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pages are ", pages.size(), " bytes; ", chunks,
                                                   " chunks need ", chunks * m.layout.chunk_bytes));
  }
  // Import: the pages as they are, and the dequantized rows attention reads.
  const int64_t Id = m.c.index_head_dim;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    std::vector<uint8_t>& page = s.WritePage(ch, m.layout.chunk_bytes);
    std::copy(pages.begin() + ch * m.layout.chunk_bytes,
              pages.begin() + (ch + 1) * m.layout.chunk_bytes, page.begin());
  }
  for (int64_t l = 0; l < m.L; ++l) {
    const LayerPlan& plan = m.sched.layers[l];
    if (plan.mode != AttentionMode::kFull) continue;
    LayerState& ls = s.layers[l];
    const int64_t per_chunk = C / plan.compress_ratio;
    ls.entries = chunks * per_chunk;
    ls.main_f.resize(ls.entries * m.hd);
    ls.index_f.resize(ls.entries * Id);
    const ChunkSection& mc = m.layout.Section(l, SectionKind::kMainCodes);
    const ChunkSection& ms = m.layout.Section(l, SectionKind::kMainScales);
    const ChunkSection& ic = m.layout.Section(l, SectionKind::kIndexCodes);
    const ChunkSection& is = m.layout.Section(l, SectionKind::kIndexScales);
    for (int64_t ch = 0; ch < chunks; ++ch) {
      std::span<const uint8_t> pg(s.pages[ch]);
      Dequantize(KvFormat::kMainKv, pg.subspan(mc.offset, mc.bytes),
                 pg.subspan(ms.offset, ms.bytes),
                 std::span<float>(ls.main_f.data() + ch * per_chunk * m.hd, per_chunk * m.hd));
      Dequantize(KvFormat::kIndexK, pg.subspan(ic.offset, ic.bytes),
                 pg.subspan(is.offset, is.bytes),
                 std::span<float>(ls.index_f.data() + ch * per_chunk * Id, per_chunk * Id));
    }
    for (size_t i = 0; i < ls.main_f.size(); ++i) {
      if (!std::isfinite(ls.main_f[i])) {
        return absl::DataLossError(absl::StrCat("page ", (i / m.hd) / per_chunk, " of layer ", l,
                                                " holds a non-finite value"));
      }
    }
  }
  m.RunLayers(s, early, m.E, start, n, X, pre, /*compress=*/true);
  {
    const int64_t off = cached - start;
    m.CompressDecoder(s, cached, n, std::vector<float>(X.begin() + off * m.hc * m.D, X.end()),
                      std::vector<float>(pre.begin() + off * m.hc, pre.end()));
  }
  KVC_CHECK(seg >= start);
  std::vector<float> Xs(X.begin() + (seg - start) * m.hc * m.D, X.end());
  std::vector<float> ps(pre.begin() + (seg - start) * m.hc, pre.end());
  std::vector<float> main_hidden;
  m.RunLayers(s, m.E, m.L, seg, n, Xs, ps, /*compress=*/false, &main_hidden);
  m.UpdateDraftRings(s, seg, n, main_hidden);
  s.stats.encoder_tokens = n - start;
  s.stats.replayed_tokens = cached - start;
  s.stats.compressed_tokens = n - cached;
  s.stats.decoder_tokens = n - seg;
  UpdateFullTokens(m, s);
  return m.Logits(Xs, ps, n - seg - 1);
}

}  // namespace kvc::model
