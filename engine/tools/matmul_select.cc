#include "engine/tools/matmul_select.h"

#include "absl/strings/str_cat.h"
#if KVC_WITH_CUDA
#include "kernels/cuda_matmul.h"
#endif

namespace kvc::model {

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

}  // namespace kvc::model
