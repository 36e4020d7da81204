#include "kernels/kv_ops.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/attention_kernel.cuh"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "kernels/kv_dequant.h"
#include "kernels/kv_ops_kernel.cuh"
#include "kernels/select_kernel.cuh"

namespace kvc::cuda {
namespace {

int MaxFiniteE8M0(float max_value) {
  int code = 254;
  while (!std::isfinite(DecodeE8M0(static_cast<uint8_t>(code)) * max_value)) --code;
  return code;
}

}  // namespace

absl::Status QuantizeOnDevice(KvFormat format, std::span<const float> x, std::span<uint8_t> codes,
                              std::span<uint8_t> scales) {
  if (format == KvFormat::kSwaKv) {
    return absl::InvalidArgumentError("the swa format is never stored; no device quantizer");
  }
  const int64_t n = static_cast<int64_t>(x.size()), block = SpecOf(format).scale_block;
  if (n % block != 0 || static_cast<int64_t>(codes.size()) != CodesBytes(format, n) ||
      static_cast<int64_t>(scales.size()) != ScalesBytes(format, n)) {
    return absl::InvalidArgumentError(absl::StrCat("quantize ", n, " values: got ", codes.size(),
                                                   " code bytes and ", scales.size(),
                                                   " scale bytes"));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint8_t> dc(codes.size()), ds(scales.size());
  QueueQuantize(format, dx.get(), n, dc.get(), ds.get(), nullptr);
  const std::vector<uint8_t> c = dc.ToHost(), s = ds.ToHost();
  std::copy(c.begin(), c.end(), codes.begin());
  std::copy(s.begin(), s.end(), scales.begin());
  return absl::OkStatus();
}

void QueueQuantize(KvFormat format, const float* d_x, int64_t n, uint8_t* d_codes,
                   uint8_t* d_scales, cudaStream_t stream) {
  CUDA_CHECK(LaunchQuantizeFp4(Fp4ScaleOf(format), static_cast<int>(SpecOf(format).scale_block),
                               MaxFiniteE8M0(6.0f), d_x, n, d_codes, d_scales, stream));
}

void QueueDequantize(KvFormat format, const uint8_t* d_codes, const uint8_t* d_scales, int64_t n,
                     float* d_out, cudaStream_t stream) {
  CUDA_CHECK(LaunchDequantizeFp4(Fp4ScaleOf(format), static_cast<int>(SpecOf(format).scale_block),
                                 d_codes, d_scales, n, d_out, stream));
}

RoundedFormat RoundedFormatOf(KvFormat format) {
  switch (format) {
    case KvFormat::kMainKv:
      return RoundedFormat::kMainFp4;
    case KvFormat::kIndexK:
      return RoundedFormat::kIndexFp4;
    case KvFormat::kSwaKv:
      return RoundedFormat::kWindowFp8;
  }
  return RoundedFormat::kWindowFp8;
}

int MaxScaleCode(KvFormat format) {
  return MaxFiniteE8M0(format == KvFormat::kSwaKv ? 448.0f : 6.0f);
}

absl::StatusOr<std::vector<float>> FakeQuantizeOnDevice(KvFormat format, std::span<const float> x) {
  const int64_t n = static_cast<int64_t>(x.size()), block = SpecOf(format).scale_block;
  if (n % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("round ", n, " values to ", SpecOf(format).name,
                                                   ": not whole blocks of ", block));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<float> dx(x);
  CUDA_CHECK(LaunchFakeQuantize(RoundedFormatOf(format), static_cast<int>(block),
                                MaxScaleCode(format), dx.get(), n, nullptr));
  return dx.ToHost();
}

absl::StatusOr<std::vector<float>> IndexerScoresOnDevice(std::span<const float> qi,
                                                         std::span<const float> w,
                                                         std::span<const float> keys,
                                                         std::span<const int32_t> visible,
                                                         int64_t heads, int64_t dim) {
  const int64_t queries = static_cast<int64_t>(visible.size());
  const int64_t positions = dim > 0 ? static_cast<int64_t>(keys.size()) / dim : 0;
  if (static_cast<int64_t>(qi.size()) != queries * heads * dim ||
      static_cast<int64_t>(w.size()) != queries * heads ||
      static_cast<int64_t>(keys.size()) != positions * dim) {
    return absl::InvalidArgumentError("indexer inputs do not fit queries × heads × dim");
  }
  for (int32_t v : visible) {
    if (v < 0 || v > positions) return absl::InvalidArgumentError("visible count out of range");
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<float> dq(qi), dw(w), dk(keys), out(queries * positions);
  DeviceBuffer<int32_t> dv(visible);
  CUDA_CHECK(LaunchIndexerScores(dq.get(), dw.get(), dk.get(), dv.get(), queries, heads, dim,
                                 positions, out.get(), nullptr));
  return out.ToHost();
}

namespace {

// Checks and runs attention over `page_count` pages at `device_pages` (device memory).
absl::StatusOr<std::vector<float>> Attend(
    std::span<const float> q, int64_t heads, int64_t dim, std::span<const float> window,
    const uint8_t* device_pages, int64_t page_count, const ChunkLayout& layout, int64_t layer,
    std::span<const int32_t> offsets, std::span<const int32_t> list, std::span<const float> sink,
    float scale, AttentionKernel kernel) {
  const int64_t queries = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t rows = static_cast<int64_t>(window.size()) / dim;
  const int64_t compressed = page_count * layout.Section(layer, SectionKind::kMainCodes).positions;
  for (int32_t e : list) {
    if (e >= rows || (e < 0 && -static_cast<int64_t>(e) - 1 >= compressed)) {
      return absl::InvalidArgumentError(absl::StrCat("key entry ", e, " is out of range"));
    }
  }
  DeviceBuffer<float> dq(q), dwin(window), dsink(sink), out(q.size());
  DeviceBuffer<int32_t> doff(offsets), dlist(list);
  const PagedMainKv paged = MainSections(device_pages, layout, layer);
  if (kernel == AttentionKernel::kTiled) {
    CUDA_CHECK(LaunchSparseAttentionTiled(dq.get(), queries, heads, dim, dwin.get(), paged,
                                          doff.get(), dlist.get(), dsink.get(), scale, out.get(),
                                          nullptr));
  } else {
    CUDA_CHECK(LaunchSparseAttention(dq.get(), queries, heads, dim, dwin.get(), paged, doff.get(),
                                     dlist.get(), dsink.get(), scale, out.get(), nullptr));
  }
  return out.ToHost();
}

absl::Status CheckAttentionShapes(std::span<const float> q, int64_t heads, int64_t dim,
                                  std::span<const int32_t> offsets, std::span<const int32_t> list,
                                  std::span<const float> sink) {
  const int64_t queries = static_cast<int64_t>(offsets.size()) - 1;
  if (dim <= 0 || dim % 16 != 0 || dim > kMaxAttentionDim) {
    return absl::InvalidArgumentError(absl::StrCat("attention head dimension ", dim,
                                                   ": the kernels take multiples of 16 up to ",
                                                   kMaxAttentionDim));
  }
  if (queries < 0 || static_cast<int64_t>(q.size()) != queries * heads * dim ||
      static_cast<int64_t>(sink.size()) != heads ||
      offsets.back() != static_cast<int32_t>(list.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention inputs do not fit together: ", q.size(), " query values for ", queries,
        " queries × ", heads, " heads × ", dim, ", ", sink.size(), " sinks, offsets ending at ",
        offsets.empty() ? 0 : offsets.back(), " for ", list.size(), " list entries"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> SparseAttentionOnDevice(
    std::span<const float> q, int64_t heads, int64_t dim, std::span<const float> window,
    std::span<const uint8_t> pages, const ChunkLayout& layout, int64_t layer,
    std::span<const int32_t> offsets, std::span<const int32_t> list, std::span<const float> sink,
    float scale, AttentionKernel kernel) {
  KVC_RETURN_IF_ERROR(CheckAttentionShapes(q, heads, dim, offsets, list, sink));
  if (pages.size() % layout.chunk_bytes != 0) {
    return absl::InvalidArgumentError("pages are not whole chunks");
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<uint8_t> dpages(pages);
  return Attend(q, heads, dim, window, dpages.get(),
                static_cast<int64_t>(pages.size()) / layout.chunk_bytes, layout, layer, offsets,
                list, sink, scale, kernel);
}

absl::StatusOr<std::vector<float>> SparseAttentionOnDevice(
    std::span<const float> q, int64_t heads, int64_t dim, std::span<const float> window,
    const DevicePages& pages, int64_t page_count, int64_t layer, std::span<const int32_t> offsets,
    std::span<const int32_t> list, std::span<const float> sink, float scale,
    AttentionKernel kernel) {
  KVC_RETURN_IF_ERROR(CheckAttentionShapes(q, heads, dim, offsets, list, sink));
  if (page_count < 0 || page_count > pages.capacity_chunks()) {
    return absl::InvalidArgumentError("page count beyond the device pages");
  }
  return Attend(q, heads, dim, window, pages.device(), page_count, pages.layout(), layer, offsets,
                list, sink, scale, kernel);
}

PagedMainKv MainSections(const uint8_t* device_pages, const ChunkLayout& layout, int64_t layer) {
  const ChunkSection& codes = layout.Section(layer, SectionKind::kMainCodes);
  const ChunkSection& scales = layout.Section(layer, SectionKind::kMainScales);
  return PagedMainKv{device_pages, layout.chunk_bytes, codes.positions, codes.offset,
                     scales.offset};
}

PagedIndexKv IndexSections(const uint8_t* device_pages, const ChunkLayout& layout, int64_t layer) {
  const ChunkSection& codes = layout.Section(layer, SectionKind::kIndexCodes);
  const ChunkSection& scales = layout.Section(layer, SectionKind::kIndexScales);
  return PagedIndexKv{device_pages, layout.chunk_bytes, codes.positions, codes.offset,
                      scales.offset};
}

namespace {

absl::Status CheckIndexerInputs(std::span<const float> qi, std::span<const float> w,
                                std::span<const uint8_t> pages, const ChunkLayout& layout,
                                int64_t queries, int64_t heads, int64_t dim) {
  if (static_cast<int64_t>(qi.size()) != queries * heads * dim ||
      static_cast<int64_t>(w.size()) != queries * heads || heads > 64 || dim % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("indexer inputs do not fit together: ", qi.size(), " query values and ",
                     w.size(), " weights for ", queries, " queries × ", heads,
                     " heads (at most 64) × ", dim, " dims (a multiple of 32)"));
  }
  if (pages.size() % layout.chunk_bytes != 0) {
    return absl::InvalidArgumentError("pages are not whole chunks");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> PagedIndexerScoresOnDevice(
    std::span<const float> qi, std::span<const float> w, std::span<const uint8_t> pages,
    const ChunkLayout& layout, int64_t layer, std::span<const int32_t> visible, int64_t heads,
    int64_t dim, int64_t positions) {
  const int64_t queries = static_cast<int64_t>(visible.size());
  KVC_RETURN_IF_ERROR(CheckIndexerInputs(qi, w, pages, layout, queries, heads, dim));
  const int64_t held = static_cast<int64_t>(pages.size()) / layout.chunk_bytes *
                       layout.Section(layer, SectionKind::kIndexCodes).positions;
  if (positions > held) {
    return absl::InvalidArgumentError(
        absl::StrCat("indexer over ", positions, " positions; the pages hold ", held));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  DeviceBuffer<float> dq(qi), dw(w), out(static_cast<size_t>(queries * positions));
  DeviceBuffer<uint8_t> dpages(pages);
  DeviceBuffer<int32_t> dv(visible);
  CUDA_CHECK(LaunchPagedIndexerScores(dq.get(), dw.get(),
                                      IndexSections(dpages.get(), layout, layer), dv.get(), queries,
                                      heads, dim, positions, out.get(), nullptr));
  return out.ToHost();
}

absl::StatusOr<std::vector<float>> PagedIndexerScoresAtOnDevice(
    std::span<const float> qi, std::span<const float> w, std::span<const uint8_t> pages,
    const ChunkLayout& layout, int64_t layer, std::span<const int32_t> list, int64_t heads,
    int64_t dim) {
  const int64_t queries = heads > 0 && dim > 0 ? static_cast<int64_t>(w.size()) / heads : 0;
  KVC_RETURN_IF_ERROR(CheckIndexerInputs(qi, w, pages, layout, queries, heads, dim));
  if (queries == 0 || list.size() % queries != 0) {
    return absl::InvalidArgumentError("the position list is not the same length for every query");
  }
  const int64_t held = static_cast<int64_t>(pages.size()) / layout.chunk_bytes *
                       layout.Section(layer, SectionKind::kIndexCodes).positions;
  for (int32_t t : list) {
    if (t < 0 || t >= held)
      return absl::InvalidArgumentError(absl::StrCat("index position ", t, " is out of range"));
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t per_query = static_cast<int64_t>(list.size()) / queries;
  DeviceBuffer<float> dq(qi), dw(w), out(list.size());
  DeviceBuffer<uint8_t> dpages(pages);
  DeviceBuffer<int32_t> dl(list);
  CUDA_CHECK(LaunchPagedIndexerScoresAt(dq.get(), dw.get(),
                                        IndexSections(dpages.get(), layout, layer), dl.get(),
                                        queries, per_query, heads, dim, out.get(), nullptr));
  return out.ToHost();
}

namespace {

absl::Status CheckRows(std::span<const float> scores, int64_t ld, std::span<const int32_t> counts) {
  const int64_t queries = static_cast<int64_t>(counts.size());
  if (ld <= 0 || static_cast<int64_t>(scores.size()) != queries * ld) {
    return absl::InvalidArgumentError(
        absl::StrCat(scores.size(), " scores are not ", queries, " rows of ", ld));
  }
  for (int32_t c : counts) {
    if (c < 0 || c > ld) {
      return absl::InvalidArgumentError(absl::StrCat("visible count ", c, " outside 0..", ld));
    }
  }
  return absl::OkStatus();
}

std::vector<std::vector<int32_t>> Rows(const std::vector<int32_t>& flat,
                                       const std::vector<int32_t>& count, int64_t width) {
  std::vector<std::vector<int32_t>> rows(count.size());
  for (size_t q = 0; q < count.size(); ++q) {
    rows[q].assign(flat.begin() + static_cast<int64_t>(q) * width,
                   flat.begin() + static_cast<int64_t>(q) * width + count[q]);
  }
  return rows;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int32_t>>> TopKOnDevice(std::span<const float> scores,
                                                               int64_t ld,
                                                               std::span<const int32_t> counts,
                                                               int64_t k) {
  KVC_RETURN_IF_ERROR(CheckRows(scores, ld, counts));
  if (k <= 0) return absl::InvalidArgumentError(absl::StrCat("top-k of k = ", k));
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t queries = static_cast<int64_t>(counts.size());
  DeviceBuffer<float> ds(scores);
  DeviceBuffer<int32_t> dc(counts), out(static_cast<size_t>(queries * k)),
      n(static_cast<size_t>(queries));
  CUDA_CHECK(LaunchTopK(ds.get(), ld, dc.get(), queries, k, out.get(), n.get(), nullptr));
  return Rows(out.ToHost(), n.ToHost(), k);
}

absl::StatusOr<std::vector<std::vector<int32_t>>> CandidatePoolOnDevice(
    std::span<const float> scores, int64_t ld, std::span<const int32_t> counts, int64_t block,
    int64_t topk_blocks) {
  KVC_RETURN_IF_ERROR(CheckRows(scores, ld, counts));
  if (block <= 0 || topk_blocks <= 0) {
    return absl::InvalidArgumentError("candidate blocks and their count must be positive");
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  const int64_t queries = static_cast<int64_t>(counts.size());
  const int64_t nblocks = (ld + block - 1) / block;
  DeviceBuffer<float> ds(scores), best(static_cast<size_t>(queries * nblocks));
  DeviceBuffer<int32_t> dc(counts), top(static_cast<size_t>(queries * topk_blocks)),
      ntop(static_cast<size_t>(queries)), pool(static_cast<size_t>(queries * topk_blocks * block)),
      npool(static_cast<size_t>(queries));
  CUDA_CHECK(LaunchBlockMaxima(ds.get(), ld, dc.get(), queries, block, best.get(), nullptr));
  CUDA_CHECK(LaunchTopK(best.get(), nblocks, nullptr, queries, topk_blocks, top.get(), ntop.get(),
                        nullptr));
  CUDA_CHECK(LaunchPoolPositions(top.get(), topk_blocks, block, dc.get(), queries, pool.get(),
                                 npool.get(), nullptr));
  return Rows(pool.ToHost(), npool.ToHost(), topk_blocks * block);
}

absl::StatusOr<EntryLists> AppendSelectionOnDevice(std::span<const int32_t> offsets,
                                                   std::span<const int32_t> entries,
                                                   const std::vector<std::vector<int32_t>>& picked,
                                                   int64_t k,
                                                   const std::vector<std::vector<int32_t>>* lists) {
  const int64_t queries = static_cast<int64_t>(picked.size());
  if (static_cast<int64_t>(offsets.size()) != queries + 1 || offsets[0] != 0 ||
      offsets[queries] != static_cast<int64_t>(entries.size())) {
    return absl::InvalidArgumentError(absl::StrCat(offsets.size(), " offsets do not cut ",
                                                   entries.size(), " entries into ", queries,
                                                   " queries' lists"));
  }
  if (lists != nullptr && static_cast<int64_t>(lists->size()) != queries) {
    return absl::InvalidArgumentError("one candidate list per query");
  }
  int64_t width = 1;
  for (int64_t q = 0; q < queries; ++q) {
    if (static_cast<int64_t>(picked[q].size()) > k) {
      return absl::InvalidArgumentError(
          absl::StrCat("query ", q, " has ", picked[q].size(), " picks, more than k = ", k));
    }
    if (lists != nullptr) width = std::max<int64_t>(width, (*lists)[q].size());
  }
  if (DeviceCount() == 0) return absl::FailedPreconditionError("no CUDA device");
  std::vector<int32_t> sel(static_cast<size_t>(queries * k), -1), count, list;
  for (int64_t q = 0; q < queries; ++q) {
    std::copy(picked[q].begin(), picked[q].end(), sel.begin() + q * k);
    count.push_back(static_cast<int32_t>(picked[q].size()));
  }
  DeviceBuffer<int32_t> d_off(offsets), d_ent(entries), d_sel{std::span<const int32_t>(sel)},
      d_count{std::span<const int32_t>(count)}, out_off(static_cast<size_t>(queries + 1)),
      out_ent(entries.size() + static_cast<size_t>(queries * k));
  if (lists != nullptr) {
    list.assign(static_cast<size_t>(queries * width), -1);
    for (int64_t q = 0; q < queries; ++q)
      std::copy((*lists)[q].begin(), (*lists)[q].end(), list.begin() + q * width);
    DeviceBuffer<int32_t> d_list{std::span<const int32_t>(list)};
    CUDA_CHECK(
        LaunchListPositions(d_list.get(), width, d_count.get(), queries, k, d_sel.get(), nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());  // before d_list goes
  }
  CUDA_CHECK(LaunchAppendSelection(d_off.get(), d_ent.get(), queries, d_sel.get(), d_count.get(), k,
                                   out_off.get(), out_ent.get(), nullptr));
  EntryLists out;
  out.offsets = out_off.ToHost();
  out.entries = out_ent.ToHost();
  out.entries.resize(static_cast<size_t>(out.offsets[queries]));
  return out;
}

}  // namespace kvc::cuda
