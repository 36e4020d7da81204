// The command-line flags that say how to reach a secured etcd (cluster/etcd.h
// EtcdSecurity), shared by kvcached and kvctl. The password is read from a file, never
// taken on the command line (where every local user can read it in /proc).
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "cluster/etcd.h"

namespace kvc::cachesvc {

struct EtcdFlags {
  cluster::EtcdSecurity security;
  std::string password_file;

  void AddTo(CLI::App& app) {
    app.add_option("--etcd-ca", security.ca_file,
                   "etcd speaks TLS: trust this CA bundle for its certificate");
    app.add_option("--etcd-cert", security.cert_file,
                   "client certificate for etcd (--client-cert-auth), with --etcd-key");
    app.add_option("--etcd-key", security.key_file, "the client certificate's key");
    app.add_option("--etcd-user", security.user, "etcd authentication: this user");
    app.add_option("--etcd-password-file", password_file,
                   "etcd authentication: the user's password, from this file");
  }

  // The security to connect with: the password read, the combination checked.
  absl::StatusOr<cluster::EtcdSecurity> Resolve() const {
    cluster::EtcdSecurity s = security;
    if (!password_file.empty()) {
      absl::StatusOr<std::string> password = ReadSecretFile(password_file);
      if (!password.ok()) {
        return absl::InvalidArgumentError("--etcd-password-file " + password_file +
                                          " does not read");
      }
      s.password = *std::move(password);
    }
    if (!s.user.empty() && s.password.empty()) {
      return absl::InvalidArgumentError("--etcd-user needs --etcd-password-file");
    }
    KVC_RETURN_IF_ERROR(s.Check());
    return s;
  }
};

}  // namespace kvc::cachesvc
