// Bearer-token authentication: a token file maps tokens to tenants ("TOKEN TENANT" per
// line, '#' comments). Without a file every caller is the tenant "default". Tokens are
// never logged or echoed in errors.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace kvc::cachesvc {

class Authenticator {
 public:
  // Everyone is "default".
  Authenticator() = default;
  // InvalidArgument naming the file and line for a malformed line or a duplicate token.
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);

  // The tenant for an `authorization` metadata value ("Bearer TOKEN"), or
  // Unauthenticated (without saying which part was wrong beyond "missing" / "unknown").
  absl::StatusOr<std::string> TenantFor(const std::optional<std::string>& authorization) const;
  bool enabled() const { return enabled_; }

 private:
  bool enabled_ = false;
  std::map<std::string, std::string> tenants_;  // token → tenant
};

// The cluster credential in `path` (kvcached --cluster-secret-file), or FailedPrecondition
// naming what is wrong with it: fewer than 16 characters, an estimated entropy under
// kMinSecretBits (len × the Shannon entropy of its own characters' frequencies: it catches
// "aaaaaaaaaaaaaaaa", not every guessable text), or a file that the group or others may
// read (like ssh with a private key: a credential others can read is everyone's).
// NotFound naming the path when it cannot be read.
inline constexpr double kMinSecretBits = 32;
absl::StatusOr<std::string> ReadClusterSecret(const std::string& path);
double EstimatedSecretBits(const std::string& secret);

}  // namespace kvc::cachesvc
