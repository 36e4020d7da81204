#include "cachesvc/auth.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open auth token file \"", path, "\""));
  Authenticator a;
  a.enabled_ = true;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::istringstream fields(line);
    std::string token, tenant, extra;
    if (!(fields >> token) || token[0] == '#') continue;
    if (!(fields >> tenant) || (fields >> extra)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": expected \"TOKEN TENANT\" (two fields)"));
    }
    if (!a.tenants_.emplace(token, tenant).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": duplicate token"));
    }
  }
  if (a.tenants_.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens"));
  return a;
}

absl::StatusOr<std::string> Authenticator::TenantFor(
    const std::optional<std::string>& authorization) const {
  if (!enabled_) return std::string("default");
  constexpr std::string_view kBearer = "Bearer ";
  if (!authorization || authorization->rfind(kBearer, 0) != 0) {
    return absl::UnauthenticatedError("missing \"authorization: Bearer TOKEN\" metadata");
  }
  auto it = tenants_.find(authorization->substr(kBearer.size()));
  if (it == tenants_.end()) return absl::UnauthenticatedError("unknown bearer token");
  return it->second;
}

}  // namespace kvc::cachesvc
