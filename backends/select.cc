#include "backends/select.h"

#include "absl/strings/str_cat.h"
#if KVC_WITH_CUDA
#include "kernels/cuda_attention.h"
#include "kernels/cuda_indexer.h"
#include "kernels/cuda_matmul.h"
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
  absl::StatusOr<std::unique_ptr<MatmulBackend>> mm = MakeMatmulBackend(name);
  if (!mm.ok()) return mm.status();
  if (exact_replay && !(*mm)->batch_invariant()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replay exact needs a batch-invariant backend; ", name,
                     " is not (use --backend cuda, or --replay bounded)"));
  }
  options.matmul = *std::move(mm);
#if KVC_WITH_CUDA
  if (name != "cpu") {
    // One copy of each sequence's pages on the device serves both.
    const std::shared_ptr<cuda::PageMirror> mirror = cuda::MakePageMirror();
    absl::StatusOr<std::unique_ptr<AttentionBackend>> at = cuda::MakeCudaAttention(mirror);
    if (!at.ok()) return at.status();
    options.attention = *std::move(at);
    absl::StatusOr<std::unique_ptr<IndexerBackend>> ix = cuda::MakeCudaIndexer(mirror);
    if (!ix.ok()) return ix.status();
    options.indexer = *std::move(ix);
  }
#endif
  return absl::OkStatus();
}

}  // namespace kvc::model
