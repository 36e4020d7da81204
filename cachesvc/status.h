// The one place where absl::Status becomes grpc::Status. The canonical codes share their
// numbering, so the conversion keeps the code and the message.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace kvc::cachesvc {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace kvc::cachesvc
