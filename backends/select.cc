#include "backends/select.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#if KVC_WITH_CUDA
#include "kernels/cuda_attention.h"
#include "kernels/cuda_indexer.h"
#include "kernels/cuda_matmul.h"
#include "kernels/hbm_arena.h"
#include "kernels/kv_dequant.h"
#endif

namespace kvc::model {
namespace {

absl::StatusOr<std::unique_ptr<MatmulBackend>> MakeMatmulBackend(const std::string& name) {
  if (name == "cpu") return MakeCpuMatmul();
  if (name == "cuda" || name == "cublas") {
#if KVC_WITH_CUDA
    return name == "cuda" ? cuda::MakeCudaMatmul() : cuda::MakeCublasMatmul();
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend ", name, ": this program was built without the CUDA backend (nvcc not found)"));
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend is \"", name, "\"; use cpu, cuda or cublas"));
}

}  // namespace

absl::Status SelectBackends(const std::string& name, bool exact_replay, ModelOptions& options) {
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<MatmulBackend> mm, MakeMatmulBackend(name));
  if (exact_replay && !mm->batch_invariant()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replay exact needs a batch-invariant backend; ", name,
                     " is not (use --backend cuda, or --replay bounded)"));
  }
  options.matmul = std::move(mm);
#if KVC_WITH_CUDA
  if (name != "cpu") {
    // One copy of each sequence's pages on the device serves both.
    const std::shared_ptr<cuda::PageMirror> mirror = cuda::MakePageMirror();
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> at, cuda::MakeCudaAttention(mirror));
    options.attention = std::move(at);
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<IndexerBackend> ix, cuda::MakeCudaIndexer(mirror));
    options.indexer = std::move(ix);
  }
#endif
  return absl::OkStatus();
}

HbmChunkReader MakeHbmChunkReader() {
#if KVC_WITH_CUDA
  if (cuda::DeviceCount() == 0) return nullptr;
  struct Mapped {
    Mutex mu;
    std::map<uint64_t, std::unique_ptr<cuda::MappedHbmArena>> arenas
        ABSL_GUARDED_BY(mu);  // by arena_id
  };
  auto mapped = std::make_shared<Mapped>();
  return [mapped](std::string_view handle, int device, uint64_t arena_id,
                  std::span<const uint64_t> offsets, uint64_t chunk_bytes,
                  std::span<uint8_t> out) -> absl::Status {
    MutexLock lock(mapped->mu);
    std::unique_ptr<cuda::MappedHbmArena>& arena = mapped->arenas[arena_id];
    if (arena == nullptr) {
      absl::StatusOr<std::unique_ptr<cuda::MappedHbmArena>> m =
          cuda::MappedHbmArena::Open(handle, device);
      if (!m.ok()) {
        mapped->arenas.erase(arena_id);
        return m.status();
      }
      arena = *std::move(m);
    }
    std::vector<cuda::HbmChunk> chunks;
    for (uint64_t at : offsets) chunks.push_back({at, chunk_bytes});
    return arena->CopyToHost(chunks, out);
  };
#else
  return nullptr;
#endif
}

}  // namespace kvc::model
