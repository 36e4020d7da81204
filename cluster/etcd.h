// Etcd: the few calls of etcd's v3 gRPC API that membership needs (leases, put, prefix
// range, prefix watch), with a deadline on every unary call. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mutex.h"

namespace grpc {
class Channel;
class ClientContext;
class Status;
}  // namespace grpc

namespace kvc::cluster {

// "etcd://H:P[,H:P…]" → the endpoints ("H:P,H:P"). InvalidArgument naming what is wrong.
absl::StatusOr<std::string> ParseEtcdUrl(const std::string& url);

// How to reach an etcd that runs with TLS and/or authentication (docs/cluster.md). Empty
// fields: plaintext, no client certificate, no user.
struct EtcdSecurity {
  std::string ca_file;    // set: TLS, trusting this CA bundle for etcd's certificate
  std::string cert_file;  // with key_file: the client certificate (etcd --client-cert-auth)
  std::string key_file;
  std::string user;  // set: etcd authentication as this user (etcd auth enable)
  std::string password;
  bool tls() const { return !ca_file.empty(); }
  // InvalidArgument naming the mistake: a certificate without its key (or the reverse),
  // a client certificate without TLS, a password without a user.
  absl::Status Check() const;
};

class Etcd {
 public:
  struct KeyValue {
    std::string key, value;
    int64_t lease = 0;  // the lease the key is attached to (0: none)
  };
  struct RangeResult {
    std::vector<KeyValue> kvs;
    int64_t revision = 0;  // the store's revision the range was read at
  };

  // `endpoints`: "H:P[,H:P…]" (several: IPv4 addresses, tried in turn by gRPC). Files of
  // `security` that do not read are InvalidArgument naming them. With a user, every call
  // carries etcd's auth token, taken at the first call and again when etcd says it is no
  // longer valid; a wrong user or password is Unauthenticated naming the user.
  static absl::StatusOr<std::unique_ptr<Etcd>> Connect(const std::string& endpoints,
                                                       const EtcdSecurity& security = {});
  ~Etcd();

  absl::StatusOr<int64_t> GrantLease(int ttl_seconds);
  // The lease's remaining TTL after the refresh; NotFound when it has expired.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
  // Puts the key only if it does not exist (one transaction on create_revision == 0):
  // nullopt when it was created, else the key as it is (nothing written).
  absl::StatusOr<std::optional<KeyValue>> CreateIfAbsent(const std::string& key,
                                                         const std::string& value, int64_t lease);
  // The key, or nullopt when it does not exist.
  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key);
  absl::StatusOr<RangeResult> RangePrefix(const std::string& prefix);
  // Streams changes under `prefix` from `start_revision` into `on_event` (put = false: the
  // key was deleted or its lease expired) until the stream breaks or CancelWatches is
  // called; returns why it ended.
  absl::Status WatchPrefix(const std::string& prefix, int64_t start_revision,
                           const std::function<void(bool put, const KeyValue&)>& on_event);
  // Ends every WatchPrefix in progress (they return Cancelled).
  void CancelWatches();

  const std::string& endpoints() const { return endpoints_; }
  int call_timeout_ms = 2000;

 private:
  struct Stubs;
  Etcd(std::string endpoints, std::shared_ptr<grpc::Channel> channel, EtcdSecurity security);
  // A call's context: its deadline (none for a stream) and, with a user, the auth token.
  std::unique_ptr<grpc::ClientContext> Context(bool deadline = true);
  // Runs a unary call; with a user, takes a token first and once more if etcd refuses it.
  template <typename Call>
  grpc::Status Authorized(const Call& call);
  absl::Status Authenticate();

  EtcdSecurity security_;
  Mutex token_mu_;
  std::string token_ ABSL_GUARDED_BY(token_mu_);  // etcd's auth token (with a user)

  std::string endpoints_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stubs> stubs_;
  Mutex watch_mu_;
  std::set<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(watch_mu_);
  bool cancelled_ ABSL_GUARDED_BY(watch_mu_) = false;
};

}  // namespace kvc::cluster
