// Etcd: the few calls of etcd's v3 gRPC API that membership needs (leases, put, prefix
// range, prefix watch), with a deadline on every unary call. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace kvc::cluster {

// "etcd://H:P[,H:P…]" → the endpoints ("H:P,H:P"). InvalidArgument naming what is wrong.
absl::StatusOr<std::string> ParseEtcdUrl(const std::string& url);

class Etcd {
 public:
  struct KeyValue {
    std::string key, value;
  };
  struct RangeResult {
    std::vector<KeyValue> kvs;
    int64_t revision = 0;  // the store's revision the range was read at
  };

  // `endpoints`: "H:P[,H:P…]" (several: IPv4 addresses, tried in turn by gRPC).
  static absl::StatusOr<std::unique_ptr<Etcd>> Connect(const std::string& endpoints);
  ~Etcd();

  absl::StatusOr<int64_t> GrantLease(int ttl_seconds);
  // The lease's remaining TTL after the refresh; NotFound when it has expired.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  absl::Status RevokeLease(int64_t lease);
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
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
  Etcd(std::string endpoints, std::shared_ptr<grpc::Channel> channel);
  std::unique_ptr<grpc::ClientContext> Context() const;

  std::string endpoints_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stubs> stubs_;
  std::mutex watch_mu_;
  std::set<grpc::ClientContext*> watches_;
  bool cancelled_ = false;
};

}  // namespace kvc::cluster
