// The one place where absl::Status and grpc::Status convert into each other (the server
// answers with grpc::Status; the client hands absl::Status to its callers). The canonical
// codes share their numbering, so the conversion keeps the code and the message.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace kvc::wire {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// "OK", "NOT_FOUND", …: the name clients see, for logs.
inline std::string StatusCodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Codes that mean the server failed, not that the caller asked for something wrong.
inline bool IsServerFault(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::UNAVAILABLE:
      return true;
    default:
      return false;
  }
}

}  // namespace kvc::wire
