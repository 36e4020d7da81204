// Passing a failed absl::Status up in one line.
//
//   KVC_RETURN_IF_ERROR(store.Put(key, bytes));        // returns the status if not ok
//   KVC_ASSIGN_OR_RETURN(Chunk c, store.Get(key));      // declares c from a StatusOr
//   KVC_ASSIGN_OR_RETURN(existing, store.Get(key));     // or assigns to an existing one
//
// The expression is evaluated once; the returned status is the callee's, unchanged (its
// message already names what failed). Works in functions returning absl::Status or any
// absl::StatusOr<T>.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvc::internal {
inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace kvc::internal

#define KVC_STATUS_CONCAT_INNER(a, b) a##b
#define KVC_STATUS_CONCAT(a, b) KVC_STATUS_CONCAT_INNER(a, b)

#define KVC_RETURN_IF_ERROR(expr)                            \
  do {                                                       \
    if (const auto& kvc_status_ = (expr); !kvc_status_.ok()) \
      return ::kvc::internal::AsStatus(kvc_status_);         \
  } while (0)

#define KVC_ASSIGN_OR_RETURN(lhs, expr) \
  KVC_ASSIGN_OR_RETURN_IMPL(KVC_STATUS_CONCAT(kvc_statusor_, __LINE__), lhs, expr)

#define KVC_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr)     \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
