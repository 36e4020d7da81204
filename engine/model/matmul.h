// MatmulBackend: the seam between the model's control flow and the device that runs its
// matrix products (every projection, the experts, the indexer's q·k, the vocabulary head).
//
// The default contract is the CPU GEMM's (engine/cpu/gemm.h): y (m × out) = x (m × in) · Wᵀ with
// every output element ONE fused multiply-add chain over k in increasing order, starting
// from +0. A backend that keeps it computes the same bits as the CPU for any batch shape,
// so the engine stays batch invariant (exact resume) and its logits do not depend on the
// backend. Backends are told which matrices are weights (Register, once, after loading)
// so they can keep them resident; any other matrix is transient (valid for one call).
// Thread-safe: the model calls Gemm from several threads at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/cpu/gemm.h"
#include "engine/spec/kv_codec.h"

namespace kvc::model {

// What becomes of each row of a product's result before anything reads it, done where the
// result is (a device backend runs it on the device: no pass of the host over the rows
// between the product and what reads them, and the rows are final there). Row r, at
// position first_position + r, is `heads` vectors of width / heads floats; each is, in
// this order, RMS-normalized (cpu::RmsNorm by `norm` with `eps`; if norm), turned by RoPE
// at the row's position (cpu::ApplyRope with rope_freqs; if rope_freqs), rounded to
// `round`'s format and back (FakeQuantize; if round) and multiplied by `multiplier` (if
// not 1). The CPU's bits on every backend.
struct RowFinish {
  int64_t heads = 1;
  const float* norm = nullptr;
  double eps = 0.0;
  const std::vector<double>* rope_freqs = nullptr;
  int64_t first_position = 0;
  std::optional<KvFormat> round;
  float multiplier = 1.0f;
};
// The finish on the host: y is rows × width. Aborts, naming the shapes, when width is not
// `heads` vectors (or a vector not whole blocks of the rounding's scale).
void FinishRows(const RowFinish& f, int64_t rows, int64_t width, float* y);
void CheckFinish(const RowFinish& f, int64_t width);

// One product of a group: y (m × w.out_features()) = x (m × w.in_features()) · Wᵀ.
struct GemmCall {
  const float* x = nullptr;
  int64_t m = 0;
  const cpu::PackedMatrix* w = nullptr;
  float* y = nullptr;
  // A chained input: when input_of >= 0, x is unused and the input is the result of an
  // earlier call of the group, calls[input_of] (m rows of w.in_features()), each row
  // RMS-normalized first — cpu::RmsNorm(row, norm_weight, w.in_features(), norm_eps). A
  // device backend normalizes it where it already is: the chain costs no round trip.
  int64_t input_of = -1;
  const float* norm_weight = nullptr;
  double norm_eps = 0.0;
  // A pooled chained input (the compressor's entries that complete in this group): when
  // pool_ratio > 0, the rows are pool_pending rows from pool_kv and pool_score (host, of
  // w.in_features() each) followed by calls[input_of]'s and calls[score_of]'s results;
  // each of the m groups of pool_ratio rows is pooled (model::PoolGroup) and then
  // RMS-normalized as above. The entry's index key costs no round trip of its own.
  int64_t pool_ratio = 0, pool_pending = 0, score_of = -1;
  const float* pool_kv = nullptr;
  const float* pool_score = nullptr;
  // Optional: the result rows' finish (RowFinish), applied before later calls of the group
  // chain on the result; the caller keeps it alive for the call.
  const RowFinish* finish = nullptr;
  // Optional, for a chained input: its rows as the product read them (normalized, pooled
  // first if so), m × w.in_features(), delivered here as y is — the compressor's latents
  // are the entries' index keys' input.
  float* input_out = nullptr;
};

// Aborts, naming the call, when calls[i] chains an input that does not fit: input_of not
// an earlier call, or one of other rows or width. Nothing for an unchained call.
void CheckChain(std::span<const GemmCall> calls, size_t i);
// A pooled chained input's rows before pooling (pool_ratio × m of them): the pending rows,
// then the first results of calls[input_of] and calls[score_of].
void PooledRows(std::span<const GemmCall> calls, size_t i, std::vector<float>& kv,
                std::vector<float>& score);
// The first call before calls[i] whose chained input is the same (same earlier result,
// norm weight and eps, and a product that runs), or i: one normalization serves both.
size_t SameChainedInput(std::span<const GemmCall> calls, size_t i);
// The input of calls[i], chained or not, on the host; `storage` holds a chained input's
// normalized rows (kept for a later call with the same chained input).
const float* HostInput(std::span<const GemmCall> calls, size_t i, std::vector<float>& storage);

// One expert's share of a MoE block: its three projections and the rows routed to it with
// their routing weights; `rows` empty means every row with weight 1 (the shared expert).
struct ExpertJob {
  const cpu::PackedMatrix* w1 = nullptr;  // gate projection, D → I
  const cpu::PackedMatrix* w3 = nullptr;  // up projection, D → I
  const cpu::PackedMatrix* w2 = nullptr;  // down projection, I → D
  std::vector<int64_t> rows;
  std::vector<float> weights;
};

// A MoE block as the router and the experts see it: the gate (D → E logits) and its bias,
// per expert its three projections — the E routed ones by id, then the shared one — and
// model::RouteToken's constants (top_k, normalize, routed_scale) and SwiGlu's limit.
struct MoeBlock {
  const cpu::PackedMatrix* gate = nullptr;
  std::span<const float> gate_bias;
  std::vector<const cpu::PackedMatrix*> w1, w3, w2;  // E + 1 each, the shared expert last
  int64_t top_k = 0;
  bool normalize = false;
  float routed_scale = 1.0f;
  float limit = 0.0f;
};

// The MoE sublayer of a layer as it follows attention (mHC, engine/cpu/hyper_connections.h):
// attention's output f (rows × D) goes back into the stream, X' = cpu::HcPost(f, R, post,
// comb) per row; the block's input is cpu::RmsNorm(cpu::HcPre(X', pre), norm, eps); the
// product fn · vec X' (the next sublayer's mixes, unscaled) rides along. Everything in it
// is known before attention ends, so a device holding f can run it all where f is
// (AttentionBackend::AttendThenMoe): one wait for attention and the MoE block together.
struct MoeSublayer {
  int64_t hc = 0;
  const float* R = nullptr;     // rows × hc × D: the stream before attention
  const float* post = nullptr;  // rows × hc
  const float* comb = nullptr;  // rows × hc × hc
  const float* pre = nullptr;   // rows × hc: the MoE input's mixing
  std::span<const float> norm;  // D
  double eps = 0.0;
  const cpu::PackedMatrix* mixes_fn = nullptr;  // hc·D → (2 + hc)·hc
  MoeBlock moe;
  // Results.
  float* stream = nullptr;  // rows × hc × D: X'
  float* mixes = nullptr;   // rows × (2 + hc)·hc
  float* out = nullptr;     // rows × D: the MoE block's output
  // Optional, instead of post, comb and pre (then null): the attention sublayer's
  // coefficients from its mixes (rows × (2 + hc)·hc, the product fn · vec R, unscaled) as
  // the layer loop gets them on the host — cpu::HcScaleMixesRow with R, cpu::HcFromMixes
  // with base, scale, iters and hc_eps — computed where R and the mixes are. R and the
  // mixes may be results still landing (MatmulBackend::GemmGroupLater): a device reads
  // them there, so the attention sublayer needs nothing of its inputs back on the host.
  struct Coefficients {
    const float* mixes = nullptr;
    std::span<const float> base, scale;  // (2 + hc)·hc and 3
    int64_t iters = 0;
    double hc_eps = 0.0;
  };
  const Coefficients* coefficients = nullptr;
  // Optional: the step into the next layer as well — this sublayer's coefficients c from
  // the mixes (cpu::HcScaleMixesRow with X', cpu::HcFromMixes with base, scale, iters,
  // eps), the stream after the layer X'' = HcPost(out, X', c) (with the next layer's
  // Engram gated in, if given), and the next layer's attention input
  // RmsNorm(HcPre(X'', c.pre), norm, eps). With it only these three are
  // results (stream, mixes and out above are not written), and a device backend may
  // return before they land: they are in their buffers once the matmul backend's next
  // GemmGroup returns, whose calls may take rows of `input` or `stream` as x (the device
  // uses its own values), so the next layer's first products need no round trip.
  struct Next {
    std::span<const float> base, scale;  // this sublayer's, (2 + hc)·hc and 3
    int64_t iters = 0;
    double hc_eps = 0.0;
    std::span<const float> norm;  // the next layer's attention norm, D
    float* stream = nullptr;      // rows × hc × D: X''
    float* pre = nullptr;         // rows × hc: c.pre, the next layer's input mixing
    float* input = nullptr;       // rows × D
    // Optional: the next layer's Engram, gated into X'' before its input is taken
    // (cpu::EngramGate, cpu::EngramAdd): its products (rows × (hc + 1) × D, done
    // already) and its qw, kw (hc × D each).
    const float* engram_kv = nullptr;
    std::span<const float> engram_qw, engram_kw;
    // Optional: the mean of the hc copies of X'' (cpu::HcMeanAt; the drafter reads it of
    // the layers it targets), row r at mean + r·mean_stride (D floats), a result like X''.
    float* mean = nullptr;
    int64_t mean_stride = 0;
  };
  const Next* next = nullptr;
};

// The experts of a MoE block on the host, through `mm`'s products (the default of
// MatmulBackend::Experts). Jobs go to mm.GemmGroup in groups of at most kExpertGroupRows
// rows (bounding the intermediates): all gate and up projections, then cpu::SwiGlu, then
// all down projections. Results do not depend on the grouping.
inline constexpr int64_t kExpertGroupRows = 8192;
// Aborts, naming the shapes, when a job does not fit a block of D → I → D experts or has
// not one routing weight per row.
void CheckExpertJob(const ExpertJob& j, int64_t D, int64_t I);
class MatmulBackend;
void HostExperts(const MatmulBackend& mm, const float* x, int64_t rows,
                 std::span<const ExpertJob> jobs, float limit, float* out);

class MatmulBackend {
 public:
  virtual ~MatmulBackend() = default;
  virtual const char* name() const = 0;
  // Whether a row's result is independent of the other rows in its call (the contract
  // above). Exact resume needs it; a backend that gives it up (a vendor BLAS) trades it
  // for speed, and the model then refuses exact replay.
  virtual bool batch_invariant() const { return true; }
  // `w` is a weight that stays alive and unchanged as long as the backend is used.
  virtual void Register(const cpu::PackedMatrix& w) = 0;
  // y (m × w.out_features()) = x (m × w.in_features()) · Wᵀ.
  virtual void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const = 0;
  // The same, called from inside one of the CPU thread pool's parallel loops.
  virtual void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w,
                          float* y) const = 0;
  // Products issued together (the MoE's experts; a layer's query projections): a device
  // backend can copy and launch them all before waiting once. Each result is what Gemm
  // would give on its input; calls run in order, so a chained input is ready. A call's x
  // may be a result still landing (GemmGroupLater, MoeSublayer::Next): it reads the value
  // that lands.
  virtual void GemmGroup(std::span<const GemmCall> calls) const {
    std::vector<float> storage;
    size_t normalized_for = calls.size();  // the call whose chained input `storage` holds
    for (size_t i = 0; i < calls.size(); ++i) {
      CheckChain(calls, i);
      const size_t first = SameChainedInput(calls, i);
      const float* x = nullptr;
      if (first < i && first == normalized_for) {
        x = storage.data();  // normalized already
      } else {
        x = HostInput(calls, i, storage);
        if (calls[i].input_of >= 0) normalized_for = first;
      }
      if (calls[i].input_out != nullptr)
        std::copy(x, x + calls[i].m * calls[i].w->in_features(), calls[i].input_out);
      Gemm(x, calls[i].m, *calls[i].w, calls[i].y);
      if (calls[i].finish != nullptr)
        FinishRows(*calls[i].finish, calls[i].m, calls[i].w->out_features(), calls[i].y);
    }
  }
  // GemmGroup, returning before the results have landed (a device: without waiting).
  // Each lands in its y by this backend's next wait — a GemmGroup, a MoE call that does
  // not step on into the next layer, Settle — and until then later calls of this backend
  // and an attention batch naming it (AttentionBatch::landing) may take it as an input,
  // read where it is. The caller keeps every y alive and does not read it before then.
  // The default is GemmGroup: the results are there at once.
  virtual void GemmGroupLater(std::span<const GemmCall> calls) const { GemmGroup(calls); }
  // Waits for every result still landing; each is in its buffer after.
  virtual void Settle() const {}
  // to[0, count) = from[0, count) once `from` has landed (at once when nothing lands there):
  // a result still landing goes to a second place too, without a wait for it.
  virtual void CopyWhenLanded(const float* from, int64_t count, float* to) const {
    std::copy(from, from + count, to);
  }
  // A MoE block's experts: out (rows × D) = Σ over jobs, in order and from +0, of each job's
  // rows' weight · SwiGlu(x·W1ᵀ, x·W3ᵀ) · W2ᵀ (cpu::SwiGlu, engine/cpu/swiglu.h, with
  // `limit`), added into their rows. A device backend runs it all where the weights are,
  // with one wait; every backend that keeps the GEMM contract gives the same bits.
  virtual void Experts(const float* x, int64_t rows, std::span<const ExpertJob> jobs, float limit,
                       float* out) const {
    HostExperts(*this, x, rows, jobs, limit, out);
  }
  // The whole MoE block where the weights are, routing included, with the unchained
  // products `also` issued alongside (their results land in their y as GemmGroup's do):
  // out (rows × D) as routing on the host (model::RouteToken) and then Experts would give,
  // bit for bit, with one wait. False, having done nothing, when the backend does not
  // route (the default: the model then routes on the host and calls Experts).
  virtual bool RoutedMoe(const float* /*x*/, int64_t /*rows*/, const MoeBlock& /*moe*/,
                         std::span<const GemmCall> /*also*/, float* /*out*/) const {
    return false;
  }
};

// The CPU's batch-invariant GEMM (the default backend).
std::unique_ptr<MatmulBackend> MakeCpuMatmul();

}  // namespace kvc::model
