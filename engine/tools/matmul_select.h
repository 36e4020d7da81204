// The matmul backend a program's --backend flag names: "cpu" (the default), "cuda" (the
// GPU with the CPU's bits) or "cublas" (the GPU through cuBLAS; no exact replay). The two
// GPU ones exist only in builds with the CUDA backend; elsewhere they are a clear error.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/matmul.h"

namespace kvc::model {

// InvalidArgument for an unknown name; FailedPrecondition for a GPU backend without a GPU
// or in a build without CUDA.
absl::StatusOr<std::unique_ptr<MatmulBackend>> MakeMatmulBackend(const std::string& name);

}  // namespace kvc::model
