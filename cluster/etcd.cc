#include "cluster/etcd.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace kvc::cluster {
namespace epb = ::etcdserverpb;

namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (absl::StrContains(s.error_message(), "user name is empty")) {  // no token, etcd wants one
    return absl::PermissionDeniedError(
        absl::StrCat("etcd ", what, ": ", s.error_message(),
                     " (etcd runs with users: give --etcd-user and --etcd-password-file)"));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("etcd ", what, ": ", s.error_message()));
}

// The smallest key above every key that starts with `prefix` (etcd's range_end).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(static_cast<uint8_t>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd ", what, " ", path, " does not read"));
  }
  return text.str();
}

}  // namespace

absl::Status EtcdSecurity::Check() const {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("an etcd client certificate and its key go together");
  }
  if (!cert_file.empty() && ca_file.empty()) {
    return absl::InvalidArgumentError("an etcd client certificate needs TLS: give the etcd CA too");
  }
  if (!password.empty() && user.empty()) {
    return absl::InvalidArgumentError("an etcd password without an etcd user");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ParseEtcdUrl(const std::string& url) {
  const std::string kScheme = "etcd://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster address \"", url, "\" does not start with etcd://"));
  }
  std::vector<std::string> eps = absl::StrSplit(url.substr(kScheme.size()), ',', absl::SkipEmpty());
  if (eps.empty()) return absl::InvalidArgumentError("etcd:// names no endpoint");
  for (const std::string& e : eps) {
    const size_t colon = e.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == e.size() ||
        e.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", e, "\" is not HOST:PORT (in ", url, ")"));
    }
  }
  return absl::StrJoin(eps, ",");
}

struct Etcd::Stubs {
  std::unique_ptr<epb::KV::Stub> kv;
  std::unique_ptr<epb::Lease::Stub> lease;
  std::unique_ptr<epb::Watch::Stub> watch;
  std::unique_ptr<epb::Auth::Stub> auth;
};

Etcd::Etcd(std::string endpoints, std::shared_ptr<grpc::Channel> channel, EtcdSecurity security)
    : security_(std::move(security)),
      endpoints_(std::move(endpoints)),
      channel_(std::move(channel)),
      stubs_(new Stubs) {
  stubs_->kv = epb::KV::NewStub(channel_);
  stubs_->lease = epb::Lease::NewStub(channel_);
  stubs_->watch = epb::Watch::NewStub(channel_);
  stubs_->auth = epb::Auth::NewStub(channel_);
}

Etcd::~Etcd() = default;

absl::StatusOr<std::unique_ptr<Etcd>> Etcd::Connect(const std::string& endpoints,
                                                    const EtcdSecurity& security) {
  KVC_RETURN_IF_ERROR(security.Check());
  std::vector<std::string> eps = absl::StrSplit(endpoints, ',', absl::SkipEmpty());
  if (eps.empty()) return absl::InvalidArgumentError("no etcd endpoint");
  std::string target = eps[0];
  if (eps.size() > 1) {
    // gRPC's ipv4: scheme takes a list of addresses and fails over between them.
    for (const std::string& e : eps) {
      in_addr a{};
      if (inet_pton(AF_INET, e.substr(0, e.rfind(':')).c_str(), &a) != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("etcd endpoint \"", e, "\": with several endpoints give IPv4 addresses"));
      }
    }
    target = "ipv4:" + endpoints;
  }
  grpc::ChannelArguments args;
  // Reconnect soon after etcd comes back (the default backoff grows to 2 minutes), and
  // give up on a connection etcd accepted but does not serve yet (it accepts before it is
  // ready) after 2 s rather than gRPC's default 20 s.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (security.tls()) {
    grpc::SslCredentialsOptions ssl;
    KVC_ASSIGN_OR_RETURN(std::string ca, ReadPem(security.ca_file, "CA file"));
    ssl.pem_root_certs = ca;
    if (!security.cert_file.empty()) {
      KVC_ASSIGN_OR_RETURN(std::string cert, ReadPem(security.cert_file, "client certificate"));
      KVC_ASSIGN_OR_RETURN(std::string key, ReadPem(security.key_file, "client key"));
      ssl.pem_cert_chain = cert;
      ssl.pem_private_key = key;
    }
    creds = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateCustomChannel(target, creds, args);
  return std::unique_ptr<Etcd>(new Etcd(endpoints, std::move(channel), security));
}

std::unique_ptr<grpc::ClientContext> Etcd::Context(bool deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (deadline) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(call_timeout_ms));
  }
  MutexLock lk(token_mu_);
  if (!token_.empty()) ctx->AddMetadata("token", token_);
  return ctx;
}

absl::Status Etcd::Authenticate() {
  epb::AuthenticateRequest req;
  req.set_name(security_.user);
  req.set_password(security_.password);
  epb::AuthenticateResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(call_timeout_ms));
  grpc::Status s = stubs_->auth->Authenticate(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("Authenticate as user \"", security_.user, "\""));
  MutexLock lk(token_mu_);
  token_ = resp.token();
  return absl::OkStatus();
}

template <typename Call>
grpc::Status Etcd::Authorized(const Call& call) {
  if (security_.user.empty()) return call(Context().get());
  bool have_token;
  {
    MutexLock lk(token_mu_);
    have_token = !token_.empty();
  }
  auto refresh = [&]() -> grpc::Status {
    absl::Status a = Authenticate();
    return a.ok() ? grpc::Status::OK
                  : grpc::Status(static_cast<grpc::StatusCode>(a.code()), std::string(a.message()));
  };
  if (!have_token) {
    if (grpc::Status a = refresh(); !a.ok()) return a;
  }
  grpc::Status s = call(Context().get());
  // etcd's simple tokens expire (5 minutes by default) and die with a restart.
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    if (grpc::Status a = refresh(); !a.ok()) return a;
    s = call(Context().get());
  }
  return s;
}

absl::StatusOr<int64_t> Etcd::GrantLease(int ttl_seconds) {
  epb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  epb::LeaseGrantResponse resp;
  grpc::Status s = Authorized(
      [&](grpc::ClientContext* ctx) { return stubs_->lease->LeaseGrant(ctx, req, &resp); });
  if (!s.ok()) return FromGrpc(s, "LeaseGrant");
  if (!resp.error().empty()) return absl::UnavailableError("etcd LeaseGrant: " + resp.error());
  return resp.id();
}

absl::StatusOr<int64_t> Etcd::KeepAlive(int64_t lease) {
  epb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  epb::LeaseKeepAliveResponse resp;
  grpc::Status s = Authorized([&](grpc::ClientContext* ctx) {
    auto stream = stubs_->lease->LeaseKeepAlive(ctx);
    const bool ok = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    grpc::Status st = stream->Finish();
    return ok || !st.ok() ? st : grpc::Status(grpc::UNAVAILABLE, "stream ended");
  });
  if (!s.ok()) return FromGrpc(s, "LeaseKeepAlive");
  if (resp.ttl() <= 0) return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " expired"));
  return resp.ttl();
}

absl::Status Etcd::RevokeLease(int64_t lease) {
  epb::LeaseRevokeRequest req;
  req.set_id(lease);
  epb::LeaseRevokeResponse resp;
  grpc::Status s = Authorized(
      [&](grpc::ClientContext* ctx) { return stubs_->lease->LeaseRevoke(ctx, req, &resp); });
  return s.ok() ? absl::OkStatus() : FromGrpc(s, "LeaseRevoke");
}

absl::Status Etcd::Put(const std::string& key, const std::string& value, int64_t lease) {
  epb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  epb::PutResponse resp;
  grpc::Status s =
      Authorized([&](grpc::ClientContext* ctx) { return stubs_->kv->Put(ctx, req, &resp); });
  return s.ok() ? absl::OkStatus() : FromGrpc(s, "Put");
}

absl::StatusOr<std::optional<Etcd::KeyValue>> Etcd::CreateIfAbsent(const std::string& key,
                                                                   const std::string& value,
                                                                   int64_t lease) {
  epb::TxnRequest req;
  epb::Compare* absent = req.add_compare();
  absent->set_key(key);
  absent->set_target(epb::Compare::CREATE);
  absent->set_result(epb::Compare::EQUAL);
  absent->set_create_revision(0);
  epb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  req.add_failure()->mutable_request_range()->set_key(key);
  epb::TxnResponse resp;
  grpc::Status s =
      Authorized([&](grpc::ClientContext* ctx) { return stubs_->kv->Txn(ctx, req, &resp); });
  if (!s.ok()) return FromGrpc(s, "Txn");
  if (resp.succeeded()) return std::nullopt;
  for (const epb::ResponseOp& op : resp.responses()) {
    for (const auto& kv : op.response_range().kvs()) {
      return KeyValue{kv.key(), kv.value(), kv.lease()};
    }
  }
  // Deleted between the compare and the range of the same transaction cannot happen; a
  // key that exists has its range.
  return absl::InternalError(absl::StrCat("etcd Txn on ", key, " failed without the key"));
}

absl::StatusOr<std::optional<Etcd::KeyValue>> Etcd::Get(const std::string& key) {
  epb::RangeRequest req;
  req.set_key(key);
  epb::RangeResponse resp;
  grpc::Status s =
      Authorized([&](grpc::ClientContext* ctx) { return stubs_->kv->Range(ctx, req, &resp); });
  if (!s.ok()) return FromGrpc(s, "Range");
  for (const auto& kv : resp.kvs()) return KeyValue{kv.key(), kv.value(), kv.lease()};
  return std::nullopt;
}

absl::StatusOr<Etcd::RangeResult> Etcd::RangePrefix(const std::string& prefix) {
  epb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  epb::RangeResponse resp;
  grpc::Status s =
      Authorized([&](grpc::ClientContext* ctx) { return stubs_->kv->Range(ctx, req, &resp); });
  if (!s.ok()) return FromGrpc(s, "Range");
  RangeResult r;
  r.revision = resp.header().revision();
  for (const auto& kv : resp.kvs()) r.kvs.push_back({kv.key(), kv.value(), kv.lease()});
  return r;
}

absl::Status Etcd::WatchPrefix(const std::string& prefix, int64_t start_revision,
                               const std::function<void(bool, const KeyValue&)>& on_event) {
  // A watch starts right after a Range, whose call took the auth token it carries.
  std::unique_ptr<grpc::ClientContext> owned =
      Context(/*deadline=*/false);  // lasts until it breaks
  grpc::ClientContext& ctx = *owned;
  {
    MutexLock lk(watch_mu_);
    if (cancelled_) return absl::CancelledError("etcd watch cancelled");
    watches_.insert(&ctx);
  }
  auto stream = stubs_->watch->Watch(&ctx);
  epb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(prefix);
  create->set_range_end(PrefixEnd(prefix));
  create->set_start_revision(start_revision);
  absl::Status ended = absl::OkStatus();
  if (stream->Write(req)) {
    epb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.compact_revision() > 0) {
        ended = absl::OutOfRangeError(
            absl::StrCat("etcd compacted the history to revision ", resp.compact_revision()));
        break;
      }
      if (resp.canceled()) {
        ended = absl::AbortedError("etcd cancelled the watch: " + resp.cancel_reason());
        break;
      }
      for (const auto& ev : resp.events()) {
        on_event(ev.type() == ::mvccpb::Event::PUT, {ev.kv().key(), ev.kv().value()});
      }
    }
  }
  if (!ended.ok()) ctx.TryCancel();  // we stopped reading: end the call
  grpc::Status s = stream->Finish();
  {
    MutexLock lk(watch_mu_);
    watches_.erase(&ctx);
    if (cancelled_) return absl::CancelledError("etcd watch cancelled");
  }
  if (!ended.ok()) return ended;
  // Whatever the transport says (a dead etcd can look like CANCELLED), the watch broke:
  // only CancelWatches answers Cancelled.
  return absl::UnavailableError(absl::StrCat("etcd watch ended: ", s.error_message()));
}

void Etcd::CancelWatches() {
  MutexLock lk(watch_mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : watches_) c->TryCancel();
}

}  // namespace kvc::cluster
