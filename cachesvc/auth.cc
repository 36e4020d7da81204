#include "cachesvc/auth.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"

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

double EstimatedSecretBits(const std::string& secret) {
  if (secret.empty()) return 0;
  size_t count[256] = {};
  for (unsigned char c : secret) ++count[c];
  double bits_per_char = 0;
  for (size_t n : count) {
    if (n == 0) continue;
    const double p = static_cast<double>(n) / static_cast<double>(secret.size());
    bits_per_char -= p * std::log2(p);
  }
  return bits_per_char * static_cast<double>(secret.size());
}

absl::StatusOr<std::string> ReadClusterSecret(const std::string& path) {
  absl::StatusOr<std::string> secret = ReadSecretFile(path);
  if (!secret.ok()) return secret.status();
  constexpr char kMake[] = " (make one: head -c 24 /dev/urandom | base64 > F; chmod 600 F)";
  if (secret->size() < 16) {
    return absl::FailedPreconditionError(
        absl::StrCat("the credential is ", secret->size(), " characters; use at least 16", kMake));
  }
  if (const double bits = EstimatedSecretBits(*secret); bits < kMinSecretBits) {
    return absl::FailedPreconditionError(
        absl::StrCat("the credential looks guessable: about ", static_cast<int>(bits),
                     " bits by its characters' frequencies, under ", kMinSecretBits, kMake));
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat("cannot stat ", path));
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 0777));
    return absl::FailedPreconditionError(
        absl::StrCat(path, " may be read by its group or others (mode ", mode,
                     "); a cluster credential must be its owner's alone: chmod 600 ", path));
  }
  return secret;
}

}  // namespace kvc::cachesvc
