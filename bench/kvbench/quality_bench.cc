#include "bench/kvbench/quality_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <openssl/evp.h>
#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/splitmix.h"
#include "base/status_macros.h"
#include "bench/kvbench/bootstrap.h"
#include "bench/kvbench/harness.h"
#include "bench/kvplan/decode_flops.h"
#include "engine/model/generate.h"
#include "engine/model/model.h"
#include "engine/spec/byte_tokens.h"

namespace kvc::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- held-out text ----

// A gzipped file's text (the corpus keeps man pages as Debian ships them, gzipped; the
// manifest's size is the text's). Concatenated members are read as gzip(1) reads them.
absl::StatusOr<std::string> Gunzip(const std::string& path, const std::string& raw) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrCat("zlib cannot start inflating ", path));
  }
  std::string out;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc != Z_STREAM_END || z.avail_in > 0) {
    if (rc == Z_STREAM_END) inflateReset(&z);  // the next member
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      const std::string why = z.msg ? z.msg : "truncated";
      inflateEnd(&z);
      return absl::DataLossError(absl::StrCat(path, " is not valid gzip (", why, ")"));
    }
    out.append(buf, sizeof(buf) - z.avail_out);
    if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
      inflateEnd(&z);
      return absl::DataLossError(absl::StrCat(path, " is not valid gzip (truncated)"));
    }
  }
  inflateEnd(&z);
  return out;
}

// A held-out file's text from its bytes: gzipped files are read through gzip, as the corpus
// reads them.
absl::StatusOr<std::string> TextOf(const std::string& path, std::string raw) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) return Gunzip(path, raw);
  return raw;
}

// SHA-256 of bytes as lowercase hex, as the manifest records each file's (Python's
// hashlib.sha256(raw).hexdigest(): of the file as stored, before gunzip).
absl::StatusOr<std::string> Sha256Hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("OpenSSL's SHA-256 failed");
  }
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

// (path, text) of the documents: the files given, or the manifest's held-out split (each
// file's SHA-256 and size checked against the manifest, so a changed corpus is named, not
// measured).
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Documents(
    const QualityBenchOptions& o) {
  std::vector<std::pair<std::string, std::string>> docs;
  if (!o.held_out.empty()) {
    for (const std::string& p : o.held_out) {
      KVC_ASSIGN_OR_RETURN(std::string raw, ReadFile(p));
      KVC_ASSIGN_OR_RETURN(std::string text, TextOf(p, std::move(raw)));
      docs.emplace_back(p, std::move(text));
    }
    return docs;
  }
  KVC_ASSIGN_OR_RETURN(const std::string listing, ReadFile(o.manifest));
  const nlohmann::json m = nlohmann::json::parse(listing, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.contains("files")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", o.manifest, "\" is not a corpus manifest (no \"files\")"));
  }
  for (const nlohmann::json& f : m["files"]) {
    if (f.value("split", "") != "held_out") continue;
    const std::string path = f.value("path", "");
    absl::StatusOr<std::string> raw = ReadFile(path);
    if (!raw.ok()) {
      return absl::NotFoundError(absl::StrCat("held-out file ", path, " of ", o.manifest,
                                              " cannot be read (", raw.status().message(),
                                              "); give --held-out FILE… instead"));
    }
    KVC_ASSIGN_OR_RETURN(const std::string sha, Sha256Hex(*raw));
    if (sha != f.value("sha256", "")) {
      return absl::FailedPreconditionError(
          absl::StrCat("held-out file ", path, " has SHA-256 ", sha, "; ", o.manifest, " says ",
                       f.value("sha256", "(none)"), " (the corpus changed)"));
    }
    KVC_ASSIGN_OR_RETURN(std::string text, TextOf(path, *std::move(raw)));
    if (static_cast<int64_t>(text.size()) != f.value("bytes", int64_t{-1})) {
      return absl::FailedPreconditionError(absl::StrCat("held-out file ", path, " reads as ",
                                                        text.size(), " bytes of text; ", o.manifest,
                                                        " says ", f.value("bytes", int64_t{-1})));
    }
    docs.emplace_back(path, std::move(text));
  }
  return docs;
}

// ---- one case's runs ----

std::vector<double> LogSoftmax(const std::vector<float>& x) {
  double mx = -INFINITY;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  double sum = 0;
  for (float v : x) sum += std::exp(v - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - lse;
  return out;
}

double Kl(const std::vector<float>& ref, const std::vector<float>& other) {
  const std::vector<double> p = LogSoftmax(ref), q = LogSoftmax(other);
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) kl += std::exp(p[i]) * (p[i] - q[i]);
  return std::max(0.0, kl);
}

struct Run {
  std::vector<uint32_t> tokens;            // greedy continuation
  std::vector<std::vector<float>> logits;  // logits[k] chose tokens[k]
  std::vector<std::vector<float>> forced;  // teacher-forced: forced[k] predicts truth[k]
  double loss_bits = 0;                    // teacher-forced bits per byte over truth
};

// After a prefill or resume whose last logits are `first`: the teacher-forced read of
// `truth` (the document's next tokens), rolled back, then greedy decoding.
absl::StatusOr<Run> Continue(const model::Model& m, model::Sequence& seq,
                             absl::StatusOr<std::vector<float>> first,
                             std::span<const uint32_t> truth, int64_t greedy_steps) {
  if (!first.ok()) return first.status();
  Run r;
  const model::SequenceCheckpoint cp = m.Checkpoint(seq);
  r.forced.push_back(*first);
  if (truth.size() > 1) {
    KVC_ASSIGN_OR_RETURN(std::vector<std::vector<float>> ext,
                         m.Extend(seq, truth.first(truth.size() - 1)));
    for (std::vector<float>& l : ext) r.forced.push_back(std::move(l));
  }
  for (size_t k = 0; k < truth.size(); ++k) r.loss_bits -= LogSoftmax(r.forced[k])[truth[k]];
  r.loss_bits /= std::log(2.0) * static_cast<double>(truth.size());
  m.Rollback(seq, cp);
  KVC_ASSIGN_OR_RETURN(model::Generation g,
                       model::GenerateGreedy(m, seq, *first, greedy_steps, false));
  r.tokens = std::move(g.tokens);
  r.logits = std::move(g.logits);
  return r;
}

struct Comparison {
  int document = 0;  // the bootstrap's cluster
  double kl_first = 0;
  std::vector<double> kl_steps;  // while both contexts are still the same
  double agreement = 0, loss_diff_bits = 0;
  int64_t first_divergence = 0;  // the first greedy step whose token differs (steps: none)
  bool identical = true;
};

Comparison Compare(const Run& ref, const Run& run, int document) {
  Comparison c;
  c.document = document;
  size_t same = 0;
  while (same < ref.tokens.size() && same < run.tokens.size() &&
         (same == 0 || ref.tokens[same - 1] == run.tokens[same - 1]))
    ++same;
  for (size_t k = 0; k < same; ++k) c.kl_steps.push_back(Kl(ref.logits[k], run.logits[k]));
  c.kl_first = c.kl_steps.empty() ? 0 : c.kl_steps[0];
  size_t agree = 0;
  for (size_t k = 0; k < std::min(ref.tokens.size(), run.tokens.size()); ++k)
    agree += ref.tokens[k] == run.tokens[k];
  c.agreement =
      static_cast<double>(agree) / static_cast<double>(std::max<size_t>(1, ref.tokens.size()));
  c.first_divergence = static_cast<int64_t>(ref.tokens.size());
  for (size_t k = 0; k < std::min(ref.tokens.size(), run.tokens.size()); ++k) {
    if (ref.tokens[k] != run.tokens[k]) {
      c.first_divergence = static_cast<int64_t>(k);
      break;
    }
  }
  c.loss_diff_bits = run.loss_bits - ref.loss_bits;
  auto same_bits = [](const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k].size() != b[k].size() ||
          std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float)) != 0)
        return false;
    }
    return true;
  };
  c.identical = ref.tokens == run.tokens && same_bits(ref.logits, run.logits) &&
                same_bits(ref.forced, run.forced);
  return c;
}

// How a summary's intervals are drawn: over `documents` clusters, reproducibly.
struct Resampling {
  size_t documents = 0;
  int resamples = 0;
  uint64_t seed = 0;
};

// A mean over the cases and its bootstrap interval: {"mean", "ci95": [lo, hi]}.
nlohmann::json MeanWithInterval(const std::vector<double>& values, const std::vector<int>& doc,
                                const Resampling& rs) {
  const std::vector<double> ones(rs.documents, 1.0);
  const double mean = ClusterWeightedMean(values, doc, ones);
  const Interval ci = ClusterBootstrap(
      rs.documents, [&](std::span<const double> w) { return ClusterWeightedMean(values, doc, w); },
      rs.resamples, rs.seed);
  return {{"mean", mean}, {"ci95", {ci.lo, ci.hi}}};
}

// Where greedy decoding first left the reference: quantiles of the step, and how many cases
// fall in each range of steps ("never": identical over every step).
nlohmann::json Divergence(const std::vector<Comparison>& rows, int64_t steps) {
  std::vector<double> at;
  std::map<std::string, int64_t> hist;
  for (const Comparison& c : rows) {
    at.push_back(static_cast<double>(c.first_divergence));
    const int64_t k = c.first_divergence;
    hist[k >= steps ? "never"
         : k == 0   ? "0"
         : k < 4    ? "1-3"
         : k < 16   ? "4-15"
         : k < 64   ? "16-63"
                    : "64+"]++;
  }
  return {{"p10", Percentile(at, 0.10)},
          {"median", Percentile(at, 0.5)},
          {"p90", Percentile(at, 0.90)},
          {"histogram", hist}};
}

nlohmann::json Summarize(const std::vector<Comparison>& rows, const Resampling& rs,
                         int64_t greedy_steps) {
  std::vector<double> first, agree, loss, same, steps_sum, steps_n;
  std::vector<double> all_steps;
  std::vector<int> doc;
  bool identical = !rows.empty();
  for (const Comparison& c : rows) {
    doc.push_back(c.document);
    first.push_back(c.kl_first);
    all_steps.insert(all_steps.end(), c.kl_steps.begin(), c.kl_steps.end());
    double sum = 0;
    for (double k : c.kl_steps) sum += k;
    steps_sum.push_back(sum);
    steps_n.push_back(static_cast<double>(c.kl_steps.size()));
    agree.push_back(c.agreement);
    loss.push_back(c.loss_diff_bits);
    same.push_back(c.first_divergence >= greedy_steps ? 1.0 : 0.0);
    identical = identical && c.identical;
  }
  // KL over steps pools every step of the resampled cases: a ratio of two weighted sums.
  auto pooled = [&](std::span<const double> w) {
    const double n = ClusterWeightedMean(steps_n, doc, w);
    return n > 0 ? ClusterWeightedMean(steps_sum, doc, w) / n : 0.0;
  };
  const std::vector<double> ones(rs.documents, 1.0);
  const Interval steps_ci = ClusterBootstrap(rs.documents, pooled, rs.resamples, rs.seed);
  const nlohmann::json kl = MeanWithInterval(first, doc, rs), ag = MeanWithInterval(agree, doc, rs),
                       dl = MeanWithInterval(loss, doc, rs), id = MeanWithInterval(same, doc, rs);
  return {{"cases", rows.size()},
          {"kl_mean", kl["mean"]},
          {"kl_mean_ci95", kl["ci95"]},
          {"kl_p99", Percentile(first, 0.99)},
          {"kl_steps_mean", pooled(ones)},
          {"kl_steps_mean_ci95", {steps_ci.lo, steps_ci.hi}},
          {"kl_steps_p99", Percentile(all_steps, 0.99)},
          {"agreement", ag["mean"]},
          {"agreement_ci95", ag["ci95"]},
          {"greedy_identity", id["mean"]},
          {"greedy_identity_ci95", id["ci95"]},
          {"first_divergence", Divergence(rows, greedy_steps)},
          {"loss_diff_bits", dl["mean"]},
          {"loss_diff_bits_ci95", dl["ci95"]},
          {"bit_identical", identical}};
}

// Paired: the mean of KL(ref ‖ a) − KL(ref ‖ b) over the same cases, with its interval;
// "separated" when the interval excludes 0 (the harness tells a from b at 95 %).
nlohmann::json PairedKl(const std::vector<Comparison>& a, const std::vector<Comparison>& b,
                        const Resampling& rs) {
  std::vector<double> diff;
  std::vector<int> doc;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff.push_back(a[i].kl_first - b[i].kl_first);
    doc.push_back(a[i].document);
  }
  nlohmann::json m = MeanWithInterval(diff, doc, rs);
  const double lo = m["ci95"][0], hi = m["ci95"][1];
  m["separated"] = lo > 0 || hi < 0;
  return m;
}

// ---- decode cost by component: the backends, timed ----

struct ComponentTimes {
  std::atomic<int64_t> attention_ns{0}, indexer_ns{0}, dense_ns{0}, experts_ns{0};
  void Reset() { attention_ns = indexer_ns = dense_ns = experts_ns = 0; }
};

class Timer {
 public:
  explicit Timer(std::atomic<int64_t>& into) : into_(into), t0_(Clock::now()) {}
  ~Timer() {
    into_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
  }

 private:
  std::atomic<int64_t>& into_;
  Clock::time_point t0_;
};

class TimedAttention final : public model::AttentionBackend {
 public:
  TimedAttention(std::unique_ptr<model::AttentionBackend> inner, ComponentTimes* t)
      : inner_(std::move(inner)), t_(t) {}
  const char* name() const override { return inner_->name(); }
  absl::Status CheckShape(int64_t heads, int64_t dim) const override {
    return inner_->CheckShape(heads, dim);
  }
  bool ReadsHeld(const model::HeldSelection& s) const override { return inner_->ReadsHeld(s); }
  void Attend(const model::AttentionBatch& b) const override {
    Timer timer(t_->attention_ns);
    inner_->Attend(b);
  }
  bool AttendAndProject(const model::AttentionBatch& b, const model::OutputPath& p,
                        float* out) const override {
    Timer timer(t_->attention_ns);
    return inner_->AttendAndProject(b, p, out);
  }
  bool AttendThenMoe(const model::AttentionBatch& b, const model::OutputPath& p,
                     const model::MoeSublayer& then) const override {
    Timer timer(t_->attention_ns);
    return inner_->AttendThenMoe(b, p, then);
  }
  bool WriteEntries(const model::EntryBatch& b) const override { return inner_->WriteEntries(b); }

 private:
  std::unique_ptr<model::AttentionBackend> inner_;
  ComponentTimes* t_;
};

class TimedIndexer final : public model::IndexerBackend {
 public:
  TimedIndexer(std::unique_ptr<model::IndexerBackend> inner, ComponentTimes* t)
      : inner_(std::move(inner)), t_(t) {}
  const char* name() const override { return inner_->name(); }
  void Select(const model::IndexerBatch& b) const override {
    Timer timer(t_->indexer_ns);
    inner_->Select(b);
  }
  std::unique_ptr<model::HeldSelection> SelectHeld(const model::IndexerBatch& b) const override {
    Timer timer(t_->indexer_ns);
    return inner_->SelectHeld(b);
  }

 private:
  std::unique_ptr<model::IndexerBackend> inner_;
  ComponentTimes* t_;
};

// The inner backend's own calls (GemmGroup's Gemm, Experts' products) stay inside it, so
// each product is timed once, by the call the model made.
class TimedMatmul final : public model::MatmulBackend {
 public:
  TimedMatmul(std::unique_ptr<model::MatmulBackend> inner, ComponentTimes* t)
      : inner_(std::move(inner)), t_(t) {}
  const char* name() const override { return inner_->name(); }
  bool batch_invariant() const override { return inner_->batch_invariant(); }
  void Register(const cpu::PackedMatrix& w) override { inner_->Register(w); }
  void Gemm(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    Timer timer(t_->dense_ns);
    inner_->Gemm(x, m, w, y);
  }
  // Called inside another component's parallel loop (the indexer's): timed there.
  void GemmSerial(const float* x, int64_t m, const cpu::PackedMatrix& w, float* y) const override {
    inner_->GemmSerial(x, m, w, y);
  }
  void GemmGroup(std::span<const model::GemmCall> calls) const override {
    Timer timer(t_->dense_ns);
    inner_->GemmGroup(calls);
  }
  void GemmGroupLater(std::span<const model::GemmCall> calls) const override {
    Timer timer(t_->dense_ns);
    inner_->GemmGroupLater(calls);
  }
  void Settle() const override { inner_->Settle(); }
  void CopyWhenLanded(const float* from, int64_t count, float* to) const override {
    inner_->CopyWhenLanded(from, count, to);
  }
  void Experts(const float* x, int64_t rows, std::span<const model::ExpertJob> jobs, float limit,
               float* out) const override {
    Timer timer(t_->experts_ns);
    inner_->Experts(x, rows, jobs, limit, out);
  }
  bool RoutedMoe(const float* x, int64_t rows, const model::MoeBlock& moe,
                 std::span<const model::GemmCall> also, float* out) const override {
    Timer timer(t_->experts_ns);
    return inner_->RoutedMoe(x, rows, moe, also, out);
  }

 private:
  std::unique_ptr<model::MatmulBackend> inner_;
  ComponentTimes* t_;
};

absl::StatusOr<nlohmann::json> DecodeCost(const QualityBenchOptions& o, const ModelConfig& config,
                                          const std::string& weights,
                                          const std::vector<uint32_t>& text) {
  ComponentTimes times;
  model::ModelOptions options;
  options.chunk_tokens = o.chunk_tokens;
  options.matmul = std::make_unique<TimedMatmul>(model::MakeCpuMatmul(), &times);
  options.attention = std::make_unique<TimedAttention>(model::MakeCpuAttention(), &times);
  options.indexer = std::make_unique<TimedIndexer>(model::MakeCpuIndexer(), &times);
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> loaded,
                       model::Model::Load(config, weights, std::move(options)));
  const model::Model& m = *loaded;
  KVC_ASSIGN_OR_RETURN(std::vector<DecodeWork> work, DecodeWorkAt(config, o.decode_contexts));
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < o.decode_contexts.size(); ++i) {
    const int64_t n = o.decode_contexts[i];
    std::vector<uint32_t> prompt;  // the held-out text, repeated to the length
    while (static_cast<int64_t>(prompt.size()) < n)
      prompt.insert(prompt.end(), text.begin(),
                    text.begin() + std::min<int64_t>(static_cast<int64_t>(text.size()),
                                                     n - static_cast<int64_t>(prompt.size())));
    model::Sequence seq = m.NewSequence();
    const auto p0 = Clock::now();
    KVC_ASSIGN_OR_RETURN(std::vector<float> first,
                         m.Prefill(seq, prompt, model::PrefillMode::kCed));
    const double prefill_s = Since(p0);
    times.Reset();
    const auto d0 = Clock::now();
    KVC_ASSIGN_OR_RETURN(model::Generation g, model::GenerateGreedy(m, seq, std::move(first),
                                                                    o.decode_tokens + 1, false));
    const double per = 1e3 / static_cast<double>(o.decode_tokens);  // ms per token
    const double total = Since(d0) * per;
    auto ms = [&](const std::atomic<int64_t>& ns) { return static_cast<double>(ns) * 1e-9 * per; };
    const double attention = ms(times.attention_ns), indexer = ms(times.indexer_ns),
                 dense = ms(times.dense_ns), experts = ms(times.experts_ns);
    const DecodeWork& w = (work)[i];
    rows.push_back({{"context_tokens", n},
                    {"prefill_s", prefill_s},
                    {"ms_per_token", total},
                    {"attention_ms", attention},
                    {"indexer_ms", indexer},
                    {"dense_ms", dense},
                    {"experts_ms", experts},
                    {"rest_ms", std::max(0.0, total - attention - indexer - dense - experts)},
                    {"madds",
                     {{"dense", w.dense},
                      {"window_attention", w.window_attention},
                      {"sparse_attention", w.sparse_attention},
                      {"full_indexers", w.full_indexers},
                      {"reindex_indexers", w.reindex_indexers}}}});
  }
  return rows;
}

// ---- DSpark on the trained draft heads ----

absl::StatusOr<nlohmann::json> DSpark(const QualityBenchOptions& o, const model::Model& m,
                                      const std::vector<std::vector<uint32_t>>& prompts) {
  if (!m.has_drafter()) return nlohmann::json{{"skipped", "the config has no draft layers"}};
  if (prompts.empty()) return nlohmann::json{{"skipped", "--dspark-prompts 0"}};
  int64_t drafted = 0, accepted = 0, passes = 0, tokens = 0;
  std::vector<int64_t> kept;
  double plain_s = 0, spec_s = 0;
  for (const std::vector<uint32_t>& prompt : prompts) {
    model::Sequence a = m.NewSequence(), b = m.NewSequence();
    absl::StatusOr<std::vector<float>> fa = m.Prefill(a, prompt, model::PrefillMode::kCed);
    absl::StatusOr<std::vector<float>> fb = m.Prefill(b, prompt, model::PrefillMode::kCed);
    if (!fa.ok()) return fa.status();
    if (!fb.ok()) return fb.status();
    auto t = Clock::now();
    absl::StatusOr<model::Generation> plain =
        model::GenerateGreedy(m, a, *std::move(fa), o.dspark_steps, false);
    plain_s += Since(t);
    t = Clock::now();
    absl::StatusOr<model::Generation> spec =
        model::GenerateGreedy(m, b, *std::move(fb), o.dspark_steps, true);
    spec_s += Since(t);
    if (!plain.ok()) return plain.status();
    if (!spec.ok()) return spec.status();
    if (plain->tokens != spec->tokens) {
      return absl::InternalError("DSpark's output differs from plain greedy decoding");
    }
    drafted += spec->drafted;
    accepted += spec->accepted;
    passes += spec->main_passes;
    tokens += static_cast<int64_t>(spec->tokens.size()) - 1;  // the first came from the prefill
    if (kept.size() < spec->kept_at_depth.size()) kept.resize(spec->kept_at_depth.size(), 0);
    for (size_t d = 0; d < spec->kept_at_depth.size(); ++d) kept[d] += spec->kept_at_depth[d];
  }
  // What one speculative step costs beside one decoded token, on the last prompt's state:
  // the bound on DSpark's speedup even when every proposal is kept is (S + 1) tokens per
  // (verify + draft) — on a CPU, where a pass's cost grows with its rows, that bound can sit
  // below 1 whatever the acceptance.
  double decode_ms = 0, verify_ms = 0, draft_ms = 0;
  const int64_t S = m.config().dspark_block_size;
  if (!prompts.empty()) {
    model::Sequence seq = m.NewSequence();
    KVC_ASSIGN_OR_RETURN(std::vector<float> f,
                         m.Prefill(seq, prompts.back(), model::PrefillMode::kCed));
    const uint32_t next = model::Argmax(f);
    const std::vector<uint32_t> block(S + 1, next);
    constexpr int kReps = 8;
    for (int r = 0; r < kReps; ++r) {
      const model::SequenceCheckpoint cp = m.Checkpoint(seq);
      auto t = Clock::now();
      KVC_RETURN_IF_ERROR(m.Decode(seq, next).status());
      decode_ms += Since(t) * 1e3 / kReps;
      m.Rollback(seq, cp);
      t = Clock::now();
      KVC_RETURN_IF_ERROR(m.Extend(seq, block).status());
      verify_ms += Since(t) * 1e3 / kReps;
      m.Rollback(seq, cp);
      t = Clock::now();
      KVC_RETURN_IF_ERROR(m.Draft(seq, next).status());
      draft_ms += Since(t) * 1e3 / kReps;
    }
  }
  nlohmann::json depth = nlohmann::json::array();
  for (int64_t k : kept) depth.push_back(passes > 0 ? static_cast<double>(k) / passes : 0.0);
  const double decoded = static_cast<double>(tokens);
  return nlohmann::json{
      {"prompts", prompts.size()},
      {"prompt_tokens", prompts.empty() ? 0 : prompts[0].size()},
      {"drafted", drafted},
      {"accepted", accepted},
      {"acceptance", drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0},
      {"acceptance_by_depth", depth},
      {"tokens_per_main_pass", passes > 0 ? decoded / passes : 0.0},
      {"plain_tok_s", decoded / plain_s},
      {"dspark_tok_s", decoded / spec_s},
      {"speedup", plain_s / spec_s},
      {"decode_ms", decode_ms},
      {"verify_ms", verify_ms},
      {"draft_ms", draft_ms},
      {"speedup_bound_all_kept",
       decode_ms > 0 ? static_cast<double>(S + 1) * decode_ms / (verify_ms + draft_ms) : 0.0}};
}

// DSpark on the document's own text: greedy decoding of a small model falls into loops,
// where a drafter looks better than it is (a loop is easy to predict). Here the context is
// always the true text: the document is read teacher-forced and every `every` tokens one
// speculative step is probed from there — the main model's next token, the drafter's block
// after it, one verification pass — and rolled back. Acceptance by depth as in decoding.
absl::StatusOr<nlohmann::json> DSparkOnText(const model::Model& m,
                                            const std::vector<std::vector<uint32_t>>& docs,
                                            int64_t start, int64_t every, int64_t probes_per_doc) {
  if (!m.has_drafter()) return nlohmann::json{{"skipped", "the config has no draft layers"}};
  int64_t probes = 0, drafted = 0, accepted = 0;
  std::vector<int64_t> kept_at_depth;
  for (const std::vector<uint32_t>& toks : docs) {
    const int64_t len = static_cast<int64_t>(toks.size());
    if (len <= start + every) continue;
    model::Sequence seq = m.NewSequence();
    KVC_ASSIGN_OR_RETURN(std::vector<float> logits,
                         m.Prefill(seq, std::span(toks).first(start), model::PrefillMode::kCed));
    for (int64_t pos = start, n = 0; n < probes_per_doc && pos + every < len; ++n) {
      const model::SequenceCheckpoint cp = m.Checkpoint(seq);
      const uint32_t next = model::Argmax(logits);
      KVC_ASSIGN_OR_RETURN(std::vector<uint32_t> drafts, m.Draft(seq, next));
      std::vector<uint32_t> run = {next};
      run.insert(run.end(), drafts.begin(), drafts.end());
      KVC_ASSIGN_OR_RETURN(std::vector<std::vector<float>> verified, m.Extend(seq, run));
      size_t kept = 0;
      while (kept < drafts.size() && model::Argmax(verified[kept]) == drafts[kept]) ++kept;
      if (kept_at_depth.size() < drafts.size()) kept_at_depth.resize(drafts.size(), 0);
      for (size_t d = 0; d < kept; ++d) ++kept_at_depth[d];
      drafted += static_cast<int64_t>(drafts.size());
      accepted += static_cast<int64_t>(kept);
      ++probes;
      m.Rollback(seq, cp);
      // On along the true text.
      KVC_ASSIGN_OR_RETURN(std::vector<std::vector<float>> ext,
                           m.Extend(seq, std::span(toks).subspan(pos, every)));
      logits = std::move(ext.back());
      pos += every;
    }
  }
  nlohmann::json depth = nlohmann::json::array();
  for (int64_t k : kept_at_depth)
    depth.push_back(probes > 0 ? static_cast<double>(k) / static_cast<double>(probes) : 0.0);
  return nlohmann::json{
      {"probes", probes},
      {"every", every},
      {"acceptance", drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0},
      {"acceptance_by_depth", depth},
      {"tokens_per_main_pass",
       probes > 0 ? 1.0 + static_cast<double>(accepted) / static_cast<double>(probes) : 0.0}};
}

}  // namespace

struct CaseResult {
  double reference_loss = 0;                             // full depth, teacher-forced
  std::vector<std::pair<std::string, Comparison>> rows;  // mode → this case's comparison
  std::map<int64_t, int64_t> replayed;                   // replay length → tokens replayed
  std::optional<bool> repeat_identical;                  // the first case: run twice
};

// One case: the document's first P + fresh tokens as the prompt, resumed at P every way.
absl::StatusOr<CaseResult> RunCase(const model::Model& m, const QualityBenchOptions& o,
                                   const std::vector<uint32_t>& toks, int doc_index, int64_t P,
                                   int64_t fresh, int64_t W, bool first_case) {
  const int64_t C = o.chunk_tokens, n = P + fresh;
  const std::span<const uint32_t> prompt(toks.data(), n);
  const std::span<const uint32_t> truth(toks.data() + n, o.steps);
  CaseResult out;
  model::Sequence full_seq = m.NewSequence(), ced_seq = m.NewSequence(), prefix = m.NewSequence();
  KVC_ASSIGN_OR_RETURN(
      Run full, Continue(m, full_seq, m.Prefill(full_seq, prompt, model::PrefillMode::kFullDepth),
                         truth, o.greedy_steps));
  KVC_ASSIGN_OR_RETURN(
      Run ced, Continue(m, ced_seq, m.Prefill(ced_seq, prompt, model::PrefillMode::kCed), truth,
                        o.greedy_steps));
  KVC_RETURN_IF_ERROR(m.Prefill(prefix, prompt.first(P), model::PrefillMode::kCed).status());
  std::vector<uint8_t> pages;
  for (int64_t c = 0; c < P / C; ++c) {
    const std::span<const uint8_t> pg = prefix.page(c);
    pages.insert(pages.end(), pg.begin(), pg.end());
  }
  out.reference_loss = full.loss_bits;
  out.rows.emplace_back("ced_vs_full", Compare(full, ced, doc_index));
  for (int64_t w : o.windows) {
    model::Sequence s = m.NewSequence();
    absl::StatusOr<std::vector<float>> l =
        m.Resume(s, pages, P, prompt, model::ReplayMode::kBounded, w);
    out.replayed[w] += s.last_stats().replayed_tokens;
    KVC_ASSIGN_OR_RETURN(Run b, Continue(m, s, std::move(l), truth, o.greedy_steps));
    out.rows.emplace_back(absl::StrCat("bounded_", w, "_vs_full"), Compare(full, b, doc_index));
    out.rows.emplace_back(absl::StrCat("bounded_", w, "_vs_ced"), Compare(ced, b, doc_index));
    if (first_case && w == W) {
      // Run-to-run noise: the same resume again must give the same bits.
      model::Sequence again = m.NewSequence();
      absl::StatusOr<std::vector<float>> l2 =
          m.Resume(again, pages, P, prompt, model::ReplayMode::kBounded, w);
      KVC_ASSIGN_OR_RETURN(Run b2, Continue(m, again, std::move(l2), truth, o.greedy_steps));
      out.repeat_identical = Compare(b, b2, doc_index).identical;
    }
  }
  model::Sequence s = m.NewSequence();
  KVC_ASSIGN_OR_RETURN(
      Run exact, Continue(m, s, m.Resume(s, pages, P, prompt, model::ReplayMode::kExact), truth,
                          o.greedy_steps));
  out.rows.emplace_back("exact_vs_ced", Compare(ced, exact, doc_index));
  return out;
}

absl::StatusOr<nlohmann::json> RunQualityBench(const QualityBenchOptions& o) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.config));
  if (!HoldsByteTokens(config.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.config, ": a vocabulary of ", config.vocab_size, " cannot hold the byte tokens"));
  }
  if (o.variants.empty()) return absl::InvalidArgumentError("no weights to measure (--weights)");
  const int64_t W = config.sliding_window, C = o.chunk_tokens;
  const int64_t fresh = o.new_tokens > 0 ? o.new_tokens : W;
  for (int64_t w : o.windows) {
    if (w < 0) return absl::InvalidArgumentError(absl::StrCat("--windows has ", w, " (< 0)"));
  }
  KVC_ASSIGN_OR_RETURN(auto all, Documents(o));
  // Documents long enough for a resume point past twice the window and a continuation.
  const int64_t min_len = 2 * W + 2 * C + fresh + o.steps + 1;
  std::vector<std::pair<std::string, std::vector<uint32_t>>> docs;
  for (const auto& [path, text] : all) {
    if (static_cast<int64_t>(text.size()) >= min_len) docs.emplace_back(path, EncodeBytes(text));
  }
  std::sort(docs.begin(), docs.end());
  if (o.shuffle != 0) {
    // A seeded sample across the split (its languages), not the first paths' directory.
    uint64_t s = o.shuffle;
    for (size_t i = docs.size(); i > 1; --i) std::swap(docs[i - 1], docs[SplitMix64(s) % i]);
  }
  if (static_cast<int>(docs.size()) > o.documents) docs.resize(o.documents);
  std::sort(docs.begin(), docs.end());
  if (docs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no document has the ", min_len,
                                                   " bytes a resume point past the window needs"));
  }
  nlohmann::json out = {
      {"config", o.config},
      {"window", W},
      {"chunk_tokens", C},
      {"new_tokens", fresh},
      {"steps", o.steps},
      {"greedy_steps", o.greedy_steps},
      {"bootstrap", {{"resamples", o.bootstrap}, {"seed", o.seed}, {"over", "documents"}}},
      {"shuffle", o.shuffle},
      // SGLang's test of bounded replay on V4.1: mean KL ≤ 0.01 between
      // cached and replayed logprobs.
      {"sglang_kl_bar", 0.01},
      {"windows", o.windows},
      {"documents", nlohmann::json::array()},
      {"variants", nlohmann::json::object()}};
  for (const auto& d : docs) out["documents"].push_back(d.first);
  for (const auto& [name, weights] : o.variants) {
    model::ModelOptions options;
    options.chunk_tokens = C;
    absl::StatusOr<std::unique_ptr<model::Model>> loaded =
        model::Model::Load(config, weights, std::move(options));
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(name, " (", weights, "): ", loaded.status().message()));
    }
    const model::Model& m = **loaded;
    // The cases (document, resume point) in order; each is independent of the others, so
    // `jobs` threads run them and the results are merged in this order: the figures do not
    // depend on the thread count.
    std::vector<std::pair<int, int64_t>> plan;
    for (int doc_index = 0; doc_index < static_cast<int>(docs.size()); ++doc_index) {
      const int64_t len = static_cast<int64_t>(docs[doc_index].second.size());
      const int64_t last = (std::min(len - o.steps - 1, o.max_prompt_tokens) - fresh) / C;
      const int64_t first = (2 * W + C - 1) / C;
      std::vector<int64_t> points;
      for (int i = 0; i < o.points; ++i) {
        const int64_t k = o.points == 1
                              ? std::max(first, last)
                              : first + (std::max(first, last) - first) * i / (o.points - 1);
        if (points.empty() || points.back() != k) points.push_back(k);
      }
      for (int64_t k : points) plan.emplace_back(doc_index, k * C);
    }
    const auto t0 = Clock::now();
    std::vector<absl::StatusOr<CaseResult>> results(plan.size(), absl::CancelledError("not run"));
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < plan.size();) {
        const auto [doc_index, P] = plan[i];
        results[i] = RunCase(m, o, docs[doc_index].second, doc_index, P, fresh, W, i == 0);
        if (!results[i].ok()) next.store(plan.size());  // stop early: the first error is reported
      }
    };
    std::vector<std::thread> threads;
    for (int j = 1; j < std::min<int>(o.jobs, static_cast<int>(plan.size())); ++j)
      threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();
    std::map<std::string, std::vector<Comparison>> rows;
    std::vector<double> reference_loss;
    std::map<int64_t, int64_t> replayed;  // replay length → tokens replayed over the cases
    int64_t cases = 0;
    bool repeat_identical = false;
    for (absl::StatusOr<CaseResult>& r : results) {
      if (absl::IsCancelled(r.status())) continue;  // after another case's error
      KVC_RETURN_IF_ERROR(r.status());
    }
    for (absl::StatusOr<CaseResult>& r : results) {
      reference_loss.push_back(r->reference_loss);
      for (auto& [mode, c] : r->rows) rows[mode].push_back(std::move(c));
      for (const auto& [w, n] : r->replayed) replayed[w] += n;
      if (r->repeat_identical.has_value()) repeat_identical = *r->repeat_identical;
      ++cases;
    }
    nlohmann::json v = {
        {"weights", weights}, {"cases", cases}, {"seconds", Since(t0)}, {"jobs", o.jobs}};
    double ref = 0;
    for (double x : reference_loss) ref += x;
    v["held_out_bits_per_byte"] =
        ref / static_cast<double>(std::max<size_t>(1, reference_loss.size()));
    const Resampling rs{docs.size(), o.bootstrap, o.seed};
    for (const auto& [key, r] : rows) v["modes"][key] = Summarize(r, rs, o.greedy_steps);
    v["run_to_run"] = {{"repeated", absl::StrCat("the first case's bounded replay at W = ", W)},
                       {"bit_identical", repeat_identical}};
    if (o.windows.size() >= 2) {
      const auto [lo, hi] = std::minmax_element(o.windows.begin(), o.windows.end());
      v["separation"] = PairedKl(rows[absl::StrCat("bounded_", *lo, "_vs_full")],
                                 rows[absl::StrCat("bounded_", *hi, "_vs_full")], rs);
      v["separation"]["windows"] = {*lo, *hi};
    }
    for (int64_t w : o.windows) {
      // What was replayed: at least the decoder's segment (window − new tokens).
      const double mean =
          static_cast<double>(replayed[w]) / static_cast<double>(std::max<int64_t>(1, cases));
      v["modes"][absl::StrCat("bounded_", w, "_vs_full")]["replayed_tokens"] = mean;
      v["modes"][absl::StrCat("bounded_", w, "_vs_ced")]["replayed_tokens"] = mean;
    }
    std::vector<std::vector<uint32_t>> prompts;
    for (const auto& [path, toks] : docs) {
      if (static_cast<int>(prompts.size()) >= o.dspark_prompts) break;
      const int64_t n = std::min<int64_t>(4 * W, static_cast<int64_t>(toks.size()));
      prompts.emplace_back(toks.begin(), toks.begin() + n);
    }
    KVC_ASSIGN_OR_RETURN(nlohmann::json ds, DSpark(o, m, prompts));
    if (o.dspark_prompts > 0) {
      std::vector<std::vector<uint32_t>> texts;
      for (const auto& d : docs) texts.push_back(d.second);
      KVC_ASSIGN_OR_RETURN(ds["on_text"],
                           DSparkOnText(m, texts, 2 * W, o.dspark_probe_every, o.dspark_probes));
    }
    v["dspark"] = ds;
    out["variants"][name] = v;
  }
  if (!o.decode_contexts.empty()) {
    std::vector<uint32_t> text;
    for (const auto& d : docs) text.insert(text.end(), d.second.begin(), d.second.end());
    KVC_ASSIGN_OR_RETURN(nlohmann::json cost,
                         DecodeCost(o, config, o.variants.back().second, text));
    out["decode_cost"] = {{"variant", o.variants.back().first}, {"rows", cost}};
  }
  return out;
}

std::string QualityBenchToText(const nlohmann::json& r) {
  std::string s = absl::StrFormat(
      "kvbench quality: %s, window %d, %d documents, resume points every %d tokens + %d new, "
      "%d tokens decoded greedily and %d read teacher-forced per case; intervals: %d bootstrap "
      "resamples of the documents (seed %d)\n",
      r["config"].get<std::string>(), r["window"].get<int64_t>(), r["documents"].size(),
      r["chunk_tokens"].get<int64_t>(), r["new_tokens"].get<int64_t>(),
      r["greedy_steps"].get<int64_t>(), r["steps"].get<int64_t>(),
      r["bootstrap"]["resamples"].get<int>(), r["bootstrap"]["seed"].get<uint64_t>());
  for (const auto& [name, v] : r["variants"].items()) {
    absl::StrAppendFormat(&s,
                          "\n%s (%s): %d cases in %.0f s; held-out %.3f bits/byte (full depth, "
                          "teacher-forced)\n",
                          name, v["weights"].get<std::string>(), v["cases"].get<int64_t>(),
                          v["seconds"].get<double>(), v["held_out_bits_per_byte"].get<double>());
    absl::StrAppend(&s, absl::StrFormat("  %-22s %-29s %9s %9s %6s %6s %8s %-27s %s\n", "mode",
                                        "KL mean [95% interval]", "KL p99", "KL steps", "agree",
                                        "same", "1st diff", "Δloss b/B [95% interval]", "bits"));
    // "mean [lo, hi]": KL in 3 significant digits, a loss difference signed in 4 decimals.
    auto ci = [](const nlohmann::json& m, const std::string& key) {
      const double x = m[key].get<double>(), lo = m[key + "_ci95"][0], hi = m[key + "_ci95"][1];
      return key == "loss_diff_bits" ? absl::StrFormat("%+.4f [%+.4f, %+.4f]", x, lo, hi)
                                     : absl::StrFormat("%.3g [%.2g, %.2g]", x, lo, hi);
    };
    for (const auto& [key, m] : v["modes"].items()) {
      absl::StrAppend(
          &s, absl::StrFormat(
                  "  %-22s %-29s %9.3g %9.3g %6.3f %6.3f %8.0f %-27s %s\n", key, ci(m, "kl_mean"),
                  m["kl_p99"].get<double>(), m["kl_steps_mean"].get<double>(),
                  m["agreement"].get<double>(), m["greedy_identity"].get<double>(),
                  m["first_divergence"]["median"].get<double>(), ci(m, "loss_diff_bits"),
                  m["bit_identical"].get<bool>() ? "identical" : "differ"));
    }
    if (v.contains("separation")) {
      const nlohmann::json& sep = v["separation"];
      absl::StrAppendFormat(
          &s,
          "  W = %d vs W = %d, paired over the same cases: KL difference %.3g [%.2g, %.2g]: %s\n",
          sep["windows"][0].get<int64_t>(), sep["windows"][1].get<int64_t>(),
          sep["mean"].get<double>(), sep["ci95"][0].get<double>(), sep["ci95"][1].get<double>(),
          sep["separated"].get<bool>() ? "told apart at 95 %" : "NOT told apart at 95 %");
    }
    const std::string rule = absl::StrCat("bounded_", r["window"].get<int64_t>(), "_vs_full");
    if (v["modes"].contains(rule)) {
      const nlohmann::json& m = v["modes"][rule];
      absl::StrAppendFormat(&s,
                            "  the model's rule (W = %d): mean KL %.3g, upper 95%% bound %.2g, "
                            "beside SGLang's bar of %.2g: %s\n",
                            r["window"].get<int64_t>(), m["kl_mean"].get<double>(),
                            m["kl_mean_ci95"][1].get<double>(), r["sglang_kl_bar"].get<double>(),
                            m["kl_mean_ci95"][1].get<double>() <= r["sglang_kl_bar"].get<double>()
                                ? "under it"
                                : "NOT under it");
    }
    absl::StrAppendFormat(&s, "  run to run (%s, again): %s\n",
                          v["run_to_run"]["repeated"].get<std::string>(),
                          v["run_to_run"]["bit_identical"].get<bool>()
                              ? "bit-identical (no noise: the intervals are the texts' spread)"
                              : "DIFFERENT bits");
    const nlohmann::json& d = v["dspark"];
    if (d.contains("acceptance")) {
      std::string depth;
      for (const auto& a : d["acceptance_by_depth"])
        absl::StrAppendFormat(&depth, " %.2f", a.get<double>());
      absl::StrAppendFormat(&s,
                            "  DSpark: acceptance %.3f (by depth:%s), %.2f tokens per main pass; "
                            "%.1f tok/s vs plain %.1f tok/s: %.2fx\n",
                            d["acceptance"].get<double>(), depth,
                            d["tokens_per_main_pass"].get<double>(),
                            d["dspark_tok_s"].get<double>(), d["plain_tok_s"].get<double>(),
                            d["speedup"].get<double>());
      absl::StrAppendFormat(&s,
                            "          one decoded token %.2f ms, a %d-token verify pass %.2f ms, "
                            "a draft %.2f ms: at most %.2fx even if every proposal were kept\n",
                            d["decode_ms"].get<double>(), d["acceptance_by_depth"].size() + 1,
                            d["verify_ms"].get<double>(), d["draft_ms"].get<double>(),
                            d["speedup_bound_all_kept"].get<double>());
      if (d.contains("on_text") && d["on_text"].contains("acceptance")) {
        const nlohmann::json& t = d["on_text"];
        std::string at;
        for (const auto& a : t["acceptance_by_depth"])
          absl::StrAppendFormat(&at, " %.2f", a.get<double>());
        absl::StrAppendFormat(&s,
                              "          on the documents' own text (%d probes, every %d tokens, "
                              "no loops): acceptance %.3f (by depth:%s), %.2f tokens per pass\n",
                              t["probes"].get<int64_t>(), t["every"].get<int64_t>(),
                              t["acceptance"].get<double>(), at,
                              t["tokens_per_main_pass"].get<double>());
      }
    }
  }
  if (r.contains("decode_cost")) {
    absl::StrAppendFormat(&s, "\ndecode cost by component (%s), ms per token:\n",
                          r["decode_cost"]["variant"].get<std::string>());
    absl::StrAppend(
        &s, absl::StrFormat("  %9s %9s %9s %9s %9s %9s %9s %10s\n", "context", "total", "attention",
                            "indexer", "dense", "experts", "rest", "prefill s"));
    for (const auto& row : r["decode_cost"]["rows"]) {
      absl::StrAppend(
          &s,
          absl::StrFormat("  %9d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %10.1f\n",
                          row["context_tokens"].get<int64_t>(), row["ms_per_token"].get<double>(),
                          row["attention_ms"].get<double>(), row["indexer_ms"].get<double>(),
                          row["dense_ms"].get<double>(), row["experts_ms"].get<double>(),
                          row["rest_ms"].get<double>(), row["prefill_s"].get<double>()));
    }
  }
  return s;
}

}  // namespace kvc::bench
