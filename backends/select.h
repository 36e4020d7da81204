// The backends a program's --backend flag names: "cpu" (the default), "cuda" (matrix
// products, the indexer and attention on the GPU, with the CPU's bits) or "cublas"
// (products through cuBLAS, the rest as for cuda; no exact replay). The GPU ones exist only in
// builds with the CUDA backend; elsewhere they are a clear error.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/matmul.h"
#include "engine/model/model.h"

namespace kvc::model {

// Sets options.matmul, .indexer and .attention for `name`. InvalidArgument for an unknown
// name, or for `exact_replay` with a backend that is not batch invariant (cublas);
// FailedPrecondition for a GPU backend without a GPU or in a build without CUDA.
absl::Status SelectBackends(const std::string& name, bool exact_replay, ModelOptions& options);

}  // namespace kvc::model
