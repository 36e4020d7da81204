#include "bench/kvbench/kernels_bench.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/kvbench/harness.h"
#include "engine/cpu/gemm.h"
#include "engine/spec/chunk_layout.h"
#include "engine/spec/kv_codec.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"
#include "kernels/attention_kernel.cuh"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/device_pages.h"
#include "kernels/gemm_kernel.cuh"
#include "kernels/kv_dequant.h"
#include "kernels/kv_ops.h"
#include "kernels/select_kernel.cuh"

namespace kvc::bench {
namespace {

using cuda::DeviceBuffer;
using Clock = std::chrono::steady_clock;

// Median over 5 rounds of the per-call milliseconds of `reps` back-to-back calls of
// `launch` on the default stream, timed with CUDA events after one warm-up call.
double DeviceMs(int reps, const std::function<void()>& launch) {
  launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> rounds;
  for (int round = 0; round < 5; ++round) {
    CUDA_CHECK(cudaEventRecord(a, nullptr));
    for (int r = 0; r < reps; ++r) launch();
    CUDA_CHECK(cudaEventRecord(b, nullptr));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    rounds.push_back(ms / reps);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return Median(rounds);
}

std::vector<float> Normal(std::mt19937_64& rng, size_t n, float sd) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// One chunk whose main and index sections of `layer` hold quantized random rows.
std::vector<uint8_t> RandomChunk(std::mt19937_64& rng, const ChunkLayout& layout, int64_t layer) {
  std::vector<uint8_t> chunk(layout.chunk_bytes);
  const std::pair<SectionKind, SectionKind> kinds[] = {
      {SectionKind::kMainCodes, SectionKind::kMainScales},
      {SectionKind::kIndexCodes, SectionKind::kIndexScales}};
  for (const auto& [codes_kind, scales_kind] : kinds) {
    const ChunkSection& c = layout.Section(layer, codes_kind);
    const ChunkSection& s = layout.Section(layer, scales_kind);
    const KvFormat f =
        codes_kind == SectionKind::kMainCodes ? KvFormat::kMainKv : KvFormat::kIndexK;
    const std::vector<float> x = Normal(rng, c.bytes * 2, 1.0f);
    Quantize(f, x, std::span(chunk).subspan(c.offset, c.bytes),
             std::span(chunk).subspan(s.offset, s.bytes));
  }
  return chunk;
}

double CopyGbps(int reps) {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const double ms = DeviceMs(std::max(1, reps / 4), [&] {
    CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, nullptr));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;  // read + write
}

struct Shapes {
  ModelConfig config;
  LayerSchedule schedule;
  ChunkLayout layout;
  int64_t layer = 0, ratio = 0;
};

nlohmann::json AttentionCase(const Shapes& s, const cuda::DevicePages& pages, int64_t context,
                             int64_t batch, int reps, double copy_gbps, std::mt19937_64& rng) {
  const ModelConfig& c = s.config;
  const int64_t dim = c.head_dim, heads = c.num_attention_heads, win = c.sliding_window;
  const int64_t positions = context / s.ratio;
  const int64_t topk = std::min<int64_t>(c.index_topk, positions);
  std::vector<int32_t> offsets = {0}, list;
  for (int64_t q = 0; q < batch; ++q) {
    for (int64_t i = 0; i < win; ++i) list.push_back(static_cast<int32_t>(q * win + i));
    for (int64_t i = 0; i < topk; ++i) list.push_back(-static_cast<int32_t>(rng() % positions) - 1);
    offsets.push_back(static_cast<int32_t>(list.size()));
  }
  DeviceBuffer<float> q(Normal(rng, batch * heads * dim, 0.1f)),
      window(Normal(rng, batch * win * dim, 1.0f)), sink(Normal(rng, heads, 1.0f)),
      out(static_cast<size_t>(batch * heads * dim));
  DeviceBuffer<int32_t> d_off(offsets), d_list(list);
  const cuda::PagedMainKv paged = cuda::MainSections(pages.device(), s.layout, s.layer);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const double bytes =
      static_cast<double>(batch) *
      (static_cast<double>(topk) * static_cast<double>(s.layout.entry.main) +
       static_cast<double>(win * dim * 4) + 2.0 * static_cast<double>(heads * dim * 4) +
       static_cast<double>((topk + win) * 4));
  nlohmann::json r = {
      {"context", context}, {"batch", batch}, {"keys_per_query", topk + win}, {"bytes", bytes}};
  for (const bool tiled : {false, true}) {
    const double ms = DeviceMs(reps, [&] {
      CUDA_CHECK((tiled ? cuda::LaunchSparseAttentionTiled : cuda::LaunchSparseAttention)(
          q.get(), batch, heads, dim, window.get(), paged, d_off.get(), d_list.get(), sink.get(),
          scale, out.get(), nullptr));
    });
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    const std::string k = tiled ? "tiled" : "twin";
    r[k + "_us"] = ms * 1e3;
    r[k + "_gbps"] = gbps;
    r[k + "_over_copy"] = gbps / copy_gbps;
  }
  return r;
}

// One decode query's indexer on a Full layer (score every visible position, block maxima,
// top blocks, pool positions, top-k) and on a Reindex layer (score the pool, top-k).
nlohmann::json IndexerCase(const Shapes& s, const cuda::DevicePages& pages, int64_t context,
                           int reps, std::mt19937_64& rng) {
  const ModelConfig& c = s.config;
  const int64_t heads = c.index_n_heads, dim = c.index_head_dim;
  const int64_t positions = context / s.ratio, bs = c.candidate_block_size;
  const int64_t nblocks = (positions + bs - 1) / bs;
  const int64_t top_blocks = c.candidate_topk_blocks, width = top_blocks * bs;
  const int64_t topk = c.index_topk;
  DeviceBuffer<float> qi(Normal(rng, heads * dim, 1.0f)), w(Normal(rng, heads, 0.1f)),
      score(static_cast<size_t>(positions)), best(static_cast<size_t>(nblocks)),
      pool_score(static_cast<size_t>(width));
  const std::vector<int32_t> visible = {static_cast<int32_t>(positions)};
  DeviceBuffer<int32_t> d_visible(visible), blocks(static_cast<size_t>(top_blocks)), n_blocks(1),
      pool(static_cast<size_t>(width)), n_pool(1), sel(static_cast<size_t>(topk)), n_sel(1);
  const cuda::PagedIndexKv paged = cuda::IndexSections(pages.device(), s.layout, s.layer);
  const double full_ms = DeviceMs(reps, [&] {
    CUDA_CHECK(cuda::LaunchPagedIndexerScores(qi.get(), w.get(), paged, d_visible.get(), 1, heads,
                                              dim, positions, score.get(), nullptr));
    CUDA_CHECK(cuda::LaunchBlockMaxima(score.get(), positions, d_visible.get(), 1, bs, best.get(),
                                       nullptr));
    CUDA_CHECK(cuda::LaunchTopK(best.get(), nblocks, nullptr, 1, top_blocks, blocks.get(),
                                n_blocks.get(), nullptr));
    CUDA_CHECK(cuda::LaunchPoolPositions(blocks.get(), top_blocks, bs, d_visible.get(), 1,
                                         pool.get(), n_pool.get(), nullptr));
    CUDA_CHECK(cuda::LaunchTopK(score.get(), positions, d_visible.get(), 1, topk, sel.get(),
                                n_sel.get(), nullptr));
  });
  const int64_t pool_n = n_pool.ToHost()[0];
  const double pool_ms = DeviceMs(reps, [&] {
    CUDA_CHECK(cuda::LaunchPagedIndexerScoresAt(qi.get(), w.get(), paged, pool.get(), 1, pool_n,
                                                heads, dim, pool_score.get(), nullptr));
    CUDA_CHECK(cuda::LaunchTopK(pool_score.get(), pool_n, nullptr, 1, topk, sel.get(), n_sel.get(),
                                nullptr));
  });
  const double key_bytes = static_cast<double>(positions * s.layout.entry.index);
  return {{"context", context},
          {"positions", positions},
          {"pool_positions", pool_n},
          {"full_us", full_ms * 1e3},
          {"full_key_gbps", key_bytes / (full_ms * 1e-3) / 1e9},
          {"pool_us", pool_ms * 1e3}};
}

nlohmann::json UploadCase(const Shapes& s, cuda::DevicePages& pages, int64_t mib) {
  const int64_t chunks =
      std::min(pages.capacity_chunks(), std::max<int64_t>(1, (mib << 20) / s.layout.chunk_bytes));
  const size_t bytes = static_cast<size_t>(chunks * s.layout.chunk_bytes);
  // As an engine sees kvcached's RAM arena: a memfd mapped shared and read-only,
  // page-locked in place (no staging copy).
  const int fd = memfd_create("kvbench-arena", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return {{"error", "memfd failed"}};
  void* writer = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void* host = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (writer == MAP_FAILED || host == MAP_FAILED) return {{"error", "mmap failed"}};
  for (size_t i = 0; i < bytes; ++i)
    static_cast<uint8_t*>(writer)[i] = static_cast<uint8_t>(i * 131);
  munmap(writer, bytes);
  const std::span<const uint8_t> span(static_cast<const uint8_t*>(host), bytes);
  auto time_upload = [&] {  // GB/s, or -1 when an upload fails
    std::vector<double> v;
    for (int i = 0; i < 5; ++i) {
      const auto t = Clock::now();
      if (!pages.UploadAsync(0, span).ok() || !pages.Synchronize().ok()) return -1.0;
      v.push_back(static_cast<double>(bytes) /
                  std::chrono::duration<double>(Clock::now() - t).count() / 1e9);
    }
    return Median(v);
  };
  const double pageable = time_upload();
  double registered = 0;
  if (cuda::DevicePages::RegisterHost(span).ok()) {
    registered = time_upload();
    cuda::DevicePages::UnregisterHost(span);
  }
  munmap(host, bytes);
  // The peer: cudaMemcpy from pinned memory, the bus's measured host-to-device rate.
  void* pinned = nullptr;
  CUDA_CHECK(cudaMallocHost(&pinned, bytes));
  for (size_t i = 0; i < bytes; ++i)
    static_cast<uint8_t*>(pinned)[i] = static_cast<uint8_t>(i * 131);
  DeviceBuffer<uint8_t> dst(bytes);
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) {
    const auto t = Clock::now();
    CUDA_CHECK(cudaMemcpy(dst.get(), pinned, bytes, cudaMemcpyHostToDevice));
    v.push_back(static_cast<double>(bytes) /
                std::chrono::duration<double>(Clock::now() - t).count() / 1e9);
  }
  CUDA_CHECK(cudaFreeHost(pinned));
  const double peer = Median(v);
  return {{"bytes", bytes},
          {"pages_gbps", registered},
          {"pageable_gbps", pageable},
          {"pinned_memcpy_gbps", peer},
          {"pages_over_pinned", peer > 0 ? registered / peer : 0.0}};
}

nlohmann::json GemmCase(cublasHandle_t handle, int64_t m, int64_t k, int64_t n, int reps,
                        std::mt19937_64& rng) {
  const std::vector<float> x = Normal(rng, m * k, 1.0f), w = Normal(rng, n * k, 1.0f);
  const cpu::PackedMatrix packed(w, n, k);
  DeviceBuffer<float> dx(x), dw(w), dp(packed.packed()), y(static_cast<size_t>(m * n)),
      yb(static_cast<size_t>(m * n)), alone(static_cast<size_t>(n));
  const float one = 1.0f, zero = 0.0f;
  auto cublas = [&](const float* xp, int64_t rows, float* out) {
    // Row-major y (rows × n) = x · Wᵀ is column-major yᵀ = W · xᵀ.
    if (cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(rows),
                    static_cast<int>(k), &one, dw.get(), static_cast<int>(k), xp,
                    static_cast<int>(k), &zero, out,
                    static_cast<int>(n)) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasSgemm failed\n");
      std::abort();
    }
  };
  const double ours_ms = DeviceMs(
      reps, [&] { CUDA_CHECK(cuda::LaunchGemm(dx.get(), m, k, dp.get(), n, y.get(), nullptr)); });
  const double blas_ms = DeviceMs(reps, [&] { cublas(dx.get(), m, yb.get()); });
  const double flops = 2.0 * static_cast<double>(m * k * n);
  // The last row alone vs inside the full call, for both.
  cublas(dx.get() + (m - 1) * k, 1, alone.get());
  const std::vector<float> all_b = yb.ToHost(), one_b = alone.ToHost();
  const bool blas_invariant =
      std::memcmp(one_b.data(), all_b.data() + (m - 1) * n, n * sizeof(float)) == 0;
  CUDA_CHECK(cuda::LaunchGemm(dx.get() + (m - 1) * k, 1, k, dp.get(), n, alone.get(), nullptr));
  const std::vector<float> all_o = y.ToHost(), one_o = alone.ToHost();
  const bool ours_invariant =
      std::memcmp(one_o.data(), all_o.data() + (m - 1) * n, n * sizeof(float)) == 0;
  return {{"m", m},
          {"k", k},
          {"n", n},
          {"ours_gflops", flops / (ours_ms * 1e-3) / 1e9},
          {"cublas_gflops", flops / (blas_ms * 1e-3) / 1e9},
          {"ours_over_cublas", blas_ms / ours_ms},
          {"ours_rows_batch_invariant", ours_invariant},
          {"cublas_rows_batch_invariant", blas_invariant}};
}

}  // namespace

absl::StatusOr<nlohmann::json> RunKernelBench(const KernelBenchOptions& o) {
  if (cuda::DeviceCount() == 0) {
    return absl::FailedPreconditionError("kvbench kernels needs a CUDA device; none was found");
  }
  Shapes s;
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.config));
  s.config = config;
  KVC_ASSIGN_OR_RETURN(LayerSchedule sched, BuildLayerSchedule(s.config));
  s.schedule = sched;
  KVC_ASSIGN_OR_RETURN(ChunkLayout layout,
                       BuildChunkLayout(s.config, s.schedule, kDefaultChunkTokens));
  s.layout = layout;
  s.layer = s.schedule.FullLayers()[0];
  s.ratio = s.schedule.layers[s.layer].compress_ratio;
  int64_t longest = 0;
  for (int64_t c : o.contexts) longest = std::max(longest, c);
  for (int64_t c : o.indexer_contexts) longest = std::max(longest, c);
  const int64_t chunks = (longest + s.layout.chunk_tokens - 1) / s.layout.chunk_tokens;
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<cuda::DevicePages> pages,
                       cuda::DevicePages::Create(s.layout, chunks));
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  // Every page holds the same random chunk: the kernels' traffic does not depend on the
  // values, and the page pool (~1 GB at 1M tokens) is far larger than the L2 cache.
  const std::vector<uint8_t> chunk = RandomChunk(rng, s.layout, s.layer);
  for (int64_t p = 0; p < chunks; ++p) {
    KVC_RETURN_IF_ERROR(pages->UploadAsync(p, chunk));
  }
  KVC_RETURN_IF_ERROR(pages->Synchronize());
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  nlohmann::json r;
  r["device"] = prop.name;
  r["config"] = o.config;
  r["seed"] = seed;
  r["layer"] = s.layer;
  r["compress_ratio"] = s.ratio;
  const double copy = CopyGbps(o.repetitions);
  r["copy_gbps"] = copy;
  r["attention"] = nlohmann::json::array();
  for (int64_t c : o.contexts) {
    for (int64_t b : o.batches) {
      r["attention"].push_back(AttentionCase(s, *pages, c, b, o.repetitions, copy, rng));
    }
  }
  r["indexer"] = nlohmann::json::array();
  for (int64_t c : o.indexer_contexts) {
    r["indexer"].push_back(IndexerCase(s, *pages, c, o.repetitions, rng));
  }
  r["upload"] = UploadCase(s, *pages, o.upload_mib);
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError("cublasCreate failed");
  }
  r["gemm"] = nlohmann::json::array();
  const int64_t D = s.config.hidden_size;
  for (int64_t m : {int64_t{1}, int64_t{64}, int64_t{2048}}) {
    r["gemm"].push_back(GemmCase(handle, m, D, s.config.q_lora_rank, o.repetitions, rng));
  }
  cublasDestroy(handle);
  return r;
}

std::string KernelBenchToText(const nlohmann::json& r) {
  std::string s =
      absl::StrCat("device ", r["device"].get<std::string>(), ", config ",
                   r["config"].get<std::string>(), ", seed ", r["seed"].get<uint64_t>(), "\n");
  absl::StrAppendFormat(&s, "device-to-device copy: %.0f GB/s (read + write)\n\n",
                        r["copy_gbps"].get<double>());
  absl::StrAppendFormat(
      &s, "sparse attention (decode; dequant + MQA)\n%9s %6s %10s %10s %8s %10s %8s\n", "context",
      "batch", "twin us", "twin/copy", "", "tiled us", "tiled/copy");
  for (const auto& a : r["attention"]) {
    absl::StrAppendFormat(&s, "%9d %6d %10.1f %10.3f %8s %10.1f %8.3f\n",
                          a["context"].get<int64_t>(), a["batch"].get<int64_t>(),
                          a["twin_us"].get<double>(), a["twin_over_copy"].get<double>(), "",
                          a["tiled_us"].get<double>(), a["tiled_over_copy"].get<double>());
  }
  absl::StrAppendFormat(&s,
                        "\nindexer, one decode query (full: score all + pool + top-k; pool: "
                        "reindex)\n%9s %10s %10s %12s %10s\n",
                        "context", "positions", "full us", "full GB/s", "pool us");
  for (const auto& i : r["indexer"]) {
    absl::StrAppendFormat(&s, "%9d %10d %10.1f %12.1f %10.1f\n", i["context"].get<int64_t>(),
                          i["positions"].get<int64_t>(), i["full_us"].get<double>(),
                          i["full_key_gbps"].get<double>(), i["pool_us"].get<double>());
  }
  const auto& u = r["upload"];
  if (u.contains("error")) {
    absl::StrAppend(&s, "\nupload: ", u["error"].get<std::string>(), "\n");
  } else {
    absl::StrAppendFormat(&s,
                          "\nhost RAM (a read-only memfd mapping, as the arena) -> HBM pages (%.0f "
                          "MB): page-locked in place %.1f GB/s, "
                          "pageable %.1f GB/s; pinned cudaMemcpy %.1f GB/s; ratio %.3f\n",
                          u["bytes"].get<double>() / 1e6, u["pages_gbps"].get<double>(),
                          u["pageable_gbps"].get<double>(), u["pinned_memcpy_gbps"].get<double>(),
                          u["pages_over_pinned"].get<double>());
  }
  absl::StrAppendFormat(&s, "\ngemm (GFLOP/s)\n%6s %6s %6s %10s %10s %8s %10s %10s\n", "m", "k",
                        "n", "ours", "cuBLAS", "ratio", "ours inv", "cuBLAS inv");
  for (const auto& g : r["gemm"]) {
    absl::StrAppendFormat(&s, "%6d %6d %6d %10.0f %10.0f %8.3f %10s %10s\n", g["m"].get<int64_t>(),
                          g["k"].get<int64_t>(), g["n"].get<int64_t>(),
                          g["ours_gflops"].get<double>(), g["cublas_gflops"].get<double>(),
                          g["ours_over_cublas"].get<double>(),
                          g["ours_rows_batch_invariant"].get<bool>() ? "yes" : "NO",
                          g["cublas_rows_batch_invariant"].get<bool>() ? "yes" : "no");
  }
  return s;
}

}  // namespace kvc::bench
