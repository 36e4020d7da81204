// ModelImpl: the V4.1 Flash forward pass's state and parts, shared by the files that
// implement them (internal to engine/model; the API is model.h). Read top to bottom:
//   model_weights.cc     loading the weights into compute form
//   model_layers.cc      embedding, Engram, the layer loop, the decoder's compression, logits
//   model_attention.cc   queries, the FP8 window, sparse attention over FP4 pages
//   model_compressor.cc  compressor pooling into global-KV entries and their pages
//   model_moe.cc         routing and the experts
//   model_dspark.cc      the DSpark drafter
//   model.cc             the public API: load, prefill, decode, checkpoint, resume
#pragma once

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
#include "base/check.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/layer_ops.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/spec/kv_codec.h"

namespace kvc::model {

using cpu::PackedMatrix;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
uint64_t NextStamp();

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
// ---- the model ----

class ModelImpl {
 public:
  ModelConfig config;
  LayerSchedule sched;
  ChunkLayout layout;
  // The config's sizes under the names the engine uses (the reference code's D, H, …).
  int64_t dim = 0;             // the residual stream's width
  int64_t n_heads = 0;         // query heads
  int64_t head_dim = 0;        // one head's width, and one token's KV width
  int64_t rope_dim = 0;        // the rotated part of a head
  int64_t hc_mult = 0;         // hyper-connection copies of the residual stream
  int64_t window = 0;          // the sliding window, in tokens
  int64_t encoder_layers = 0;  // the CED encoder's layers (from the schedule)
  int64_t n_layers = 0;        // trunk layers (draft layers follow them in `layers`)
  std::vector<float> embed;    // vocab × dim
  std::vector<float> norm;
  PackedMatrix head;
  std::vector<LayerWeights> layers;        // trunk, then draft layers
  std::vector<std::vector<double>> freqs;  // per layer
  int64_t decoder_full = -1;               // the decoder's Full layer (its global KV)
  int64_t draft_layers = 0;                // DSpark draft layers
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
  // With `head_input` the pass ends at the head: a device may carry the last layer on into
  // every row's head input (cpu::HcPre, the final norm) and return without waiting — then
  // RunLayers returns true, and head_input (rows × D), X and pre land with the next group
  // of products (FinishPass's), which reads the head input where it is.
  bool RunLayers(SequenceState& s, int64_t l0, int64_t l1, int64_t a, int64_t b,
                 std::vector<float>& X, std::vector<float>& pre, bool compress,
                 std::vector<float>* main_hidden = nullptr,
                 std::vector<float>* head_input = nullptr) const;
  // The drafter's rings for positions [a, b) from their main hidden states: the products
  // (the projection, each draft layer's window KV chained on it normalized and finished as
  // a window row) go into `calls`, and once they are done WriteDraftRings stores the rows. Nothing
  // without a drafter.
  struct DraftRingProducts {
    int64_t first = 0, rows = 0;  // positions [first, first + rows): the last window's
    std::vector<float> mh, mx;
    std::vector<std::vector<float>> kv;  // per draft layer, finished (WindowRowFinish)
    std::vector<RowFinish> finish;       // per draft layer, what its kv call points at
  };
  void DraftRingCalls(int64_t a, int64_t b, const std::vector<float>& main_hidden,
                      DraftRingProducts& p, std::vector<GemmCall>& calls) const;
  void WriteDraftRings(SequenceState& s, const DraftRingProducts& p) const;
  // The end of a trunk pass over [a, b): the drafter's rings and the logits of `rows`
  // (rows of X, the pass's), all products in one group — one wait on a device. `head`:
  // the head inputs RunLayers left (rows consecutive then), or null to take them from X.
  std::vector<std::vector<float>> FinishPass(SequenceState& s, int64_t a, int64_t b,
                                             const std::vector<float>& main_hidden,
                                             const std::vector<float>& X,
                                             const std::vector<float>& pre,
                                             std::span<const int64_t> rows,
                                             const std::vector<float>* head = nullptr) const;
  // The trunk's layers [l0, L) over positions [a, b) (X, pre: those rows), then the pass's
  // end for `rows` (FinishPass), taking the head inputs where the last layer left them.
  std::vector<std::vector<float>> LayersToLogits(SequenceState& s, int64_t l0, int64_t a, int64_t b,
                                                 std::vector<float>& X, std::vector<float>& pre,
                                                 bool compress,
                                                 std::span<const int64_t> rows) const;
  // What a window KV row (layer l's wkv product) becomes before the ring holds it: RMSNorm
  // by kv_norm, RoPE at its position (rows from `first_position` on), FP8 rounding.
  RowFinish WindowRowFinish(int64_t l, int64_t first_position) const {
    return {.norm = layers[l].attn.kv_norm.data(),
            .eps = config.rms_norm_eps,
            .rope_freqs = &freqs[l],
            .first_position = first_position,
            .round = KvFormat::kSwaKv};
  }
  // Queries (low rank, normalized, up-projected, rotated per head) and the rows' own window
  // KV (normalized, rotated, FP8-QAT'd), for positions a, a+1, …. With qi and wts, also
  // the indexer's queries (rotated, FP4-QAT'd) and its raw head weights. Each result is
  // finished where it is (RowFinish). All products go as one group, the
  // up-projections chained on the normalized low-rank query, with `also` (the mixes', the
  // compressor's; a chained input in `also` counts from its first call): one wait on a
  // device. With `landing`, without the wait (MatmulBackend::GemmGroupLater): the
  // buffers the results land in that are not the caller's go there.
  void QueriesAndWindowKv(int64_t l, int64_t a, int64_t rows, const std::vector<float>& x,
                          std::vector<float>& q, std::vector<float>& kv,
                          std::vector<float>* qi = nullptr, std::vector<float>* wts = nullptr,
                          std::span<const GemmCall> also = {},
                          std::vector<std::vector<float>>* landing = nullptr) const;
  // `also`: products issued with the sublayer's first group (the next mixes).
  void DraftAttention(SequenceState& s, int64_t l, int64_t a, int64_t b,
                      const std::vector<float>& x, std::vector<float>& out,
                      std::span<const GemmCall> also = {}) const;
  // Sparse MQA of `rows` queries (q: rows × H × hd at positions a…) over the rows `batch`
  // lists for each query (window, entries, compressed rows), then the inverse RoPE and the
  // grouped low-rank output projection.
  // With `then`, the backend may run the MoE sublayer after it where attention's output is
  // (AttentionBackend::AttendThenMoe): true when it did, `out` then untouched.
  bool AttendAndProject(int64_t l, int64_t a, int64_t rows, const std::vector<float>& q,
                        AttentionBatch batch, std::vector<float>& out,
                        const MoeSublayer* then = nullptr) const;
  // Runs `tokens` after the sequence's last token; logits of every one.
  std::vector<std::vector<float>> Extend(SequenceState& s, std::span<const uint32_t> tokens) const;
  // The decoder's global KV for positions [a, b) from the encoder output (CED).
  void CompressDecoder(SequenceState& s, int64_t a, int64_t b, std::vector<float> X,
                       const std::vector<float>& pre) const;
  std::vector<float> Embed(const SequenceState& s, int64_t a, int64_t b,
                           std::vector<float>* pre) const;
  std::vector<float> Logits(const std::vector<float>& X, const std::vector<float>& pre, int64_t row,
                            const std::vector<float>* final_norm = nullptr) const;
  // The head's input for `row`: its stream copies mixed by pre, RMS-normalized (x: D).
  void HeadInput(const std::vector<float>& X, const std::vector<float>& pre, int64_t row,
                 const std::vector<float>& final_norm, float* x) const;
  absl::Status CheckTokens(std::span<const uint32_t> tokens) const;
  // Engram of layer l over the pass [a, b): its product (the n-gram embeddings, rows ×
  // orders·heads·engram_head_dim, through wkv) depends only on the tokens, so it can be
  // issued ahead (EngramCall, results in `p`); MixEngram then gates it into X.
  // ApplyEngram does both with a product of its own.
  struct EngramProducts {
    std::vector<float> in, kv;
  };
  GemmCall EngramCall(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                      EngramProducts& p) const;
  void MixEngram(int64_t l, int64_t rows, const EngramProducts& p, std::vector<float>& X) const;
  void ApplyEngram(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                   std::vector<float>& X) const;
  // What one pass through the layers keeps: the indexer's selections — each indexed
  // layer's, the candidate pool, and those still held on a device (AttentionBatch::held) by
  // layer, whose host copies land when they are settled, before anything on the host reads
  // them — and the buffers results still landing go to (MatmulBackend::GemmGroupLater),
  // kept until the pass's last wait.
  struct PassState {
    std::map<int64_t, std::vector<std::vector<int32_t>>> topk;
    std::vector<std::vector<uint8_t>> pool;
    std::vector<std::vector<float>> landing;
    std::map<int64_t, std::unique_ptr<HeldSelection>> held;  // destroyed (settled) first
    void Settle() { held.clear(); }
  };
  // `then` is called once the query path's products (with `also`) are issued; the MoE
  // sublayer it returns (if any) may run on the device right after attention. True when it
  // did (its results in the sublayer's outputs, `out` untouched). With `later`: the
  // products are issued without a wait (GemmGroupLater), and attention and the indexer
  // read the query, the window rows and the indexer's inputs where they land (the pool and
  // a reused selection where the source's indexer left them); the compressor's rows join
  // its pending group as they land and its completed entries are written where the
  // products are (Compress); nothing of them is read on the host, and the sublayer `then`
  // gives must take its coefficients from the mixes (MoeSublayer::coefficients). The
  // buffers they land in go to `pass.landing`; the pass must wait before it ends.
  bool Attention(SequenceState& s, int64_t l, int64_t a, int64_t b, const std::vector<float>& x,
                 bool compress, std::vector<float>& out, PassState& pass,
                 std::span<const GemmCall> also = {},
                 const std::function<const MoeSublayer*()>& then = {}, bool later = false) const;
  // The compressor of Full layer l over the pass [a, b) with input x: the products for the
  // positions it has not consumed yet go into `calls` (results in `in`), and Compress
  // consumes them once they are done — so the products can join another group (the query
  // path's: one wait on a device).
  struct CompressorInput {
    int64_t first = 0, rows = 0;  // positions [first, first + rows)
    std::vector<float> kv, score;
    // The index keys of the entries this pass completes, from the same group: ratio 1 (an
    // entry per position) chained on kv normalized; ratio > 1 on the completed groups
    // pooled and normalized (GemmCall::pool_ratio). Empty when none completes.
    std::vector<float> keys;
    // With `landing` (the group issued without a wait): the completed entries' latents too,
    // the keys product's chained input (GemmCall::input_out); Compress has the attention
    // backend write the entries where the products are (AttentionBackend::WriteEntries).
    bool landing = false;
    std::vector<float> latents;
  };
  // How many compressed entries Full layer l's compressor completes over the pass [a, b)
  // (0: the pass's rows only join the pending group, which needs nothing on the host).
  int64_t EntriesCompleted(const SequenceState& s, int64_t l, int64_t a, int64_t b) const;
  void CompressorCalls(const SequenceState& s, int64_t l, int64_t a, int64_t b,
                       const std::vector<float>& x, CompressorInput& in,
                       std::vector<GemmCall>& calls, bool landing = false) const;
  // Consumes the products. Rows that complete no entry join the pending group where their
  // products land (MatmulBackend::CopyWhenLanded); with in.landing the group may still be
  // landing, and `in` must live until the backend's next wait.
  void Compress(SequenceState& s, int64_t l, CompressorInput& in) const;
  // The entries of a landing CompressorInput written by the attention backend
  // (AttentionBackend::WriteEntries), the pages claimed and the floats sized for them;
  // false when it cannot (the entry count unchanged: the host writes them then).
  bool WriteEntriesWhereTheyAre(SequenceState& s, int64_t l, const CompressorInput& in) const;
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
  // Layer l's MoE block as the matmul backend sees it.
  MoeBlock MoeBlockOf(int64_t l) const;
  std::unique_ptr<SequenceState> NewState() const;
};

template <typename T>
std::span<const T> Row(const std::vector<T>& v, int64_t row, int64_t width) {
  return std::span<const T>(v.data() + row * width, width);
}

// Appends `also` to a group; a chained input in `also` counts from the first of `also`.
inline void AppendToGroup(std::vector<GemmCall>& calls, std::span<const GemmCall> also) {
  const int64_t base = static_cast<int64_t>(calls.size());
  for (GemmCall config : also) {
    if (config.input_of >= 0) config.input_of += base;
    if (config.score_of >= 0) config.score_of += base;
    calls.push_back(config);
  }
}

inline void NormRows(std::vector<float>& x, int64_t rows, int64_t width,
                     const std::vector<float>& w, double eps) {
  for (int64_t r = 0; r < rows; ++r)
    cpu::RmsNorm(&x[r * width], w.data(), width, eps, &x[r * width]);
}

}  // namespace kvc::model
