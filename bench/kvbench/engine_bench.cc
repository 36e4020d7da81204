#include "bench/kvbench/engine_bench.h"

#include "backends/select.h"

#include <cblas.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "engine/cpu/gemm.h"
#include "engine/model/generate.h"
#include "engine/model/model.h"
#include "engine/model/weights.h"

namespace kvc::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<uint32_t> Prompt(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> t(n);
  for (uint32_t& v : t) v = static_cast<uint32_t>(rng() % vocab);
  return t;
}

// GFLOP/s of ours and of OpenBLAS on one shape, and whether OpenBLAS gives a row the same
// bits in calls of different heights (ours does by construction, and tests check it).
nlohmann::json GemmCase(int64_t m, int64_t k, int64_t n, int reps) {
  std::mt19937_64 rng(m * 31 + k);
  std::normal_distribution<float> nd;
  std::vector<float> x(m * k), w(n * k), y(m * n), yb(m * n);
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = nd(rng);
  const cpu::PackedMatrix p(w, n, k);
  std::vector<double> ours, blas;
  for (int r = 0; r < reps; ++r) {
    auto t = Clock::now();
    cpu::Gemm(x.data(), m, p, y.data());
    ours.push_back(2.0 * m * k * n / Since(t) / 1e9);
    t = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, x.data(), k, w.data(), k,
                0.f, yb.data(), n);
    blas.push_back(2.0 * m * k * n / Since(t) / 1e9);
  }
  // The last row alone vs inside the full call.
  std::vector<float> alone(n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, n, k, 1.f, x.data() + (m - 1) * k, k,
              w.data(), k, 0.f, alone.data(), n);
  const bool invariant = std::memcmp(alone.data(), yb.data() + (m - 1) * n, n * 4) == 0;
  return {{"m", m},
          {"k", k},
          {"n", n},
          {"ours_gflops", Median(ours)},
          {"openblas_gflops", Median(blas)},
          {"openblas_rows_batch_invariant", invariant}};
}

}  // namespace

absl::StatusOr<nlohmann::json> RunEngineBench(const EngineBenchOptions& o) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.config));
  model::ModelOptions options;
  KVC_RETURN_IF_ERROR(model::SelectBackends(o.backend, /*exact_replay=*/true, options));
  std::string weights = o.weights;
  std::filesystem::path tmp;
  if (weights.empty()) {
    tmp = std::filesystem::temp_directory_path() / absl::StrCat("kvbench-engine-", getpid());
    std::filesystem::create_directories(tmp);
    weights = (tmp / "weights.safetensors").string();
    KVC_ASSIGN_OR_RETURN(LayerSchedule s, BuildLayerSchedule(config));
    KVC_RETURN_IF_ERROR(model::WriteRandomWeights(config, s, 1, weights));
  }
  absl::StatusOr<std::unique_ptr<model::Model>> loaded =
      model::Model::Load(config, weights, std::move(options));
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  if (!loaded.ok()) return loaded.status();
  const model::Model& m = **loaded;
  const int64_t V = config.vocab_size, W = config.sliding_window;
  nlohmann::json out;
  out["config"] = o.config;
  out["backend"] = o.backend;

  if (!o.contexts.empty()) {
    out["contexts"] = nlohmann::json::array();
    for (int64_t n : o.contexts) {
      std::fprintf(stderr, "kvbench: context %lld: prefill\n", static_cast<long long>(n));
      const std::vector<uint32_t> prompt = Prompt(n, V, n + 1);
      model::Sequence s = m.NewSequence();
      auto t = Clock::now();
      KVC_ASSIGN_OR_RETURN(std::vector<float> l, m.Prefill(s, prompt, model::PrefillMode::kCed));
      const double prefill_s = Since(t);
      std::fprintf(stderr, "kvbench: context %lld: decode\n", static_cast<long long>(n));
      t = Clock::now();
      KVC_ASSIGN_OR_RETURN(
          model::Generation g,
          model::GenerateGreedy(m, s, std::move(l), o.decode_tokens, /*speculative=*/false));
      // The first generated token comes from the prefill's logits: decode_tokens − 1 steps.
      const double decode_s = Since(t);
      // Also said as soon as known: a run cut short (the GPU check's time budget) keeps it.
      std::fprintf(stderr, "kvbench: context %lld: prefill %.1f tok/s, decode %.3f tok/s\n",
                   static_cast<long long>(n), static_cast<double>(n) / prefill_s,
                   static_cast<double>(o.decode_tokens - 1) / decode_s);
      out["contexts"].push_back(
          {{"tokens", n},
           {"prefill_s", prefill_s},
           {"prefill_tok_s", static_cast<double>(n) / prefill_s},
           {"decode_tokens", o.decode_tokens},
           {"decode_tok_s", static_cast<double>(o.decode_tokens - 1) / decode_s}});
    }
    return out;
  }

  // Prefill: CED vs full depth, alternated.
  out["prefill"] = nlohmann::json::array();
  for (int64_t n : o.prefill_tokens) {
    const std::vector<uint32_t> prompt = Prompt(n, V, n);
    std::vector<double> ced, full;
    const bool run_full = n <= o.full_depth_max;
    for (int r = 0; r < o.repetitions; ++r) {
      for (int mode = 0; mode < (run_full ? 2 : 1); ++mode) {
        std::fprintf(stderr, "kvbench: prefill %lld tokens %s run %d\n", static_cast<long long>(n),
                     mode == 0 ? "CED" : "full depth", r + 1);
        model::Sequence s = m.NewSequence();
        const auto t = Clock::now();
        KVC_ASSIGN_OR_RETURN(
            std::vector<float> l,
            m.Prefill(s, prompt,
                      mode == 0 ? model::PrefillMode::kCed : model::PrefillMode::kFullDepth));
        (mode == 0 ? ced : full).push_back(Since(t));
      }
      if (!run_full && n >= 16384) break;  // one run of the longest prompts
    }
    nlohmann::json c = {{"tokens", n},
                        {"ced_s", Median(ced)},
                        {"ced_tok_s", static_cast<double>(n) / Median(ced)},
                        {"predicted_ced_over_full", 0.5 + static_cast<double>(W) / (2.0 * n)}};
    if (run_full) {
      c["full_depth_s"] = Median(full);
      c["full_depth_tok_s"] = static_cast<double>(n) / Median(full);
      c["ced_over_full"] = Median(ced) / Median(full);
    }
    out["prefill"].push_back(c);
  }

  // Decode: plain vs DSpark, greedy, after a 2K prompt.
  {
    const std::vector<uint32_t> prompt = Prompt(2048, V, 99);
    nlohmann::json d;
    for (bool spec : {false, true}) {
      if (spec && !m.has_drafter()) continue;
      std::vector<double> rate;
      double acceptance = 0;
      for (int r = 0; r < o.repetitions; ++r) {
        std::fprintf(stderr, "kvbench: decode %s run %d\n", spec ? "DSpark" : "plain", r + 1);
        model::Sequence s = m.NewSequence();
        KVC_ASSIGN_OR_RETURN(std::vector<float> l, m.Prefill(s, prompt, model::PrefillMode::kCed));
        const auto t = Clock::now();
        KVC_ASSIGN_OR_RETURN(model::Generation g,
                             model::GenerateGreedy(m, s, std::move(l), o.decode_tokens, spec));
        rate.push_back(static_cast<double>(o.decode_tokens - 1) / Since(t));
        acceptance = g.acceptance();
      }
      d[spec ? "dspark_tok_s" : "plain_tok_s"] = Median(rate);
      if (spec) d["dspark_acceptance"] = acceptance;
    }
    if (d.contains("dspark_tok_s"))
      d["dspark_over_plain"] = d["dspark_tok_s"].get<double>() / d["plain_tok_s"].get<double>();
    out["decode"] = d;
  }

  // Resume vs cold: TTFT of prefix + new tokens.
  {
    const int64_t C = m.layout().chunk_tokens;
    const int64_t prefix = o.resume_prefix / C * C;
    const std::vector<uint32_t> prompt = Prompt(prefix + o.resume_new, V, 7);
    model::Sequence warm_up = m.NewSequence();
    if (absl::StatusOr<std::vector<float>> l =
            m.Prefill(warm_up, std::span(prompt).first(prefix), model::PrefillMode::kCed);
        !l.ok())
      return l.status();
    std::vector<uint8_t> pages;
    for (int64_t c = 0; c < prefix / C; ++c) {
      auto p = warm_up.page(c);
      pages.insert(pages.end(), p.begin(), p.end());
    }
    std::vector<double> cold, exact, bounded;
    for (int r = 0; r < o.repetitions; ++r) {
      std::fprintf(stderr, "kvbench: resume run %d\n", r + 1);
      model::Sequence a = m.NewSequence(), b = m.NewSequence(), c = m.NewSequence();
      auto t = Clock::now();
      if (!m.Prefill(a, prompt, model::PrefillMode::kCed).ok()) return absl::InternalError("cold");
      cold.push_back(Since(t));
      t = Clock::now();
      if (!m.Resume(b, pages, prefix, prompt, model::ReplayMode::kExact).ok())
        return absl::InternalError("exact resume");
      exact.push_back(Since(t));
      t = Clock::now();
      if (!m.Resume(c, pages, prefix, prompt, model::ReplayMode::kBounded).ok())
        return absl::InternalError("bounded resume");
      bounded.push_back(Since(t));
    }
    out["resume"] = {{"prefix_tokens", prefix},
                     {"new_tokens", o.resume_new},
                     {"cold_ttft_ms", Median(cold) * 1e3},
                     {"exact_ttft_ms", Median(exact) * 1e3},
                     {"bounded_ttft_ms", Median(bounded) * 1e3},
                     {"speedup_exact", Median(cold) / Median(exact)},
                     {"speedup_bounded", Median(cold) / Median(bounded)}};
  }

  // GEMM: the engine's shapes (prefill rows; the MoE expert and attention projections).
  out["gemm"] = nlohmann::json::array();
  for (auto [mm, k, n] : {std::tuple<int64_t, int64_t, int64_t>{4096, 256, 128},
                          {4096, 128, 256},
                          {4096, 256, 1024},
                          {1, 256, 512}}) {
    out["gemm"].push_back(GemmCase(mm, k, n, std::max(3, o.repetitions)));
  }
  return out;
}

std::string EngineBenchToText(const nlohmann::json& r) {
  std::string s = absl::StrCat("config ", r["config"].get<std::string>(), ", backend ",
                               r.value("backend", std::string("cpu")), "\n\n");
  if (r.contains("contexts")) {
    absl::StrAppendFormat(&s, "%9s %12s %10s %12s\n", "context", "prefill s", "prefill tok/s",
                          "decode tok/s");
    for (const auto& c : r["contexts"]) {
      absl::StrAppendFormat(&s, "%9d %12.2f %13.0f %12.2f\n", c["tokens"].get<int64_t>(),
                            c["prefill_s"].get<double>(), c["prefill_tok_s"].get<double>(),
                            c["decode_tok_s"].get<double>());
    }
    return s;
  }
  s += "prefill\n";
  absl::StrAppendFormat(&s, "%8s %10s %12s %12s %10s %10s\n", "tokens", "CED tok/s", "full tok/s",
                        "CED/full", "predicted", "CED s");
  for (const auto& c : r["prefill"]) {
    absl::StrAppendFormat(&s, "%8d %10.0f %12s %12s %10.3f %10.2f\n", c["tokens"].get<int64_t>(),
                          c["ced_tok_s"].get<double>(),
                          c.contains("full_depth_tok_s")
                              ? absl::StrFormat("%.0f", c["full_depth_tok_s"].get<double>())
                              : "-",
                          c.contains("ced_over_full")
                              ? absl::StrFormat("%.3f", c["ced_over_full"].get<double>())
                              : "-",
                          c["predicted_ced_over_full"].get<double>(), c["ced_s"].get<double>());
  }
  const auto& d = r["decode"];
  absl::StrAppendFormat(&s, "\ndecode: plain %.1f tok/s", d["plain_tok_s"].get<double>());
  if (d.contains("dspark_tok_s")) {
    absl::StrAppendFormat(&s, ", DSpark %.1f tok/s (%.2f× plain, acceptance %.3f)",
                          d["dspark_tok_s"].get<double>(), d["dspark_over_plain"].get<double>(),
                          d["dspark_acceptance"].get<double>());
  }
  const auto& re = r["resume"];
  absl::StrAppendFormat(&s,
                        "\nresume %d cached + %d new tokens: TTFT cold %.0f ms, exact %.0f ms "
                        "(%.1f×), bounded %.0f ms (%.1f×)\n\ngemm (GFLOP/s)\n",
                        re["prefix_tokens"].get<int64_t>(), re["new_tokens"].get<int64_t>(),
                        re["cold_ttft_ms"].get<double>(), re["exact_ttft_ms"].get<double>(),
                        re["speedup_exact"].get<double>(), re["bounded_ttft_ms"].get<double>(),
                        re["speedup_bounded"].get<double>());
  for (const auto& g : r["gemm"]) {
    absl::StrAppendFormat(&s,
                          "  %5d x %4d x %4d  ours %6.1f  OpenBLAS %6.1f  (%.2f×)  OpenBLAS rows "
                          "batch-invariant: %s\n",
                          g["m"].get<int64_t>(), g["k"].get<int64_t>(), g["n"].get<int64_t>(),
                          g["ours_gflops"].get<double>(), g["openblas_gflops"].get<double>(),
                          g["ours_gflops"].get<double>() / g["openblas_gflops"].get<double>(),
                          g["openblas_rows_batch_invariant"].get<bool>() ? "yes" : "no");
  }
  return s;
}

}  // namespace kvc::bench
