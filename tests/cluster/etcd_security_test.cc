// A cluster on an etcd that runs with TLS, client certificates and authentication (Debian's
// etcd; certificates made with openssl): without the CA, without a client certificate, or
// with a wrong password nothing reads; with them every call membership needs works (lease,
// put, keep-alive, range, watch), a kvcached node registers, and the cluster client (C++)
// and kvctl see it.
#include <grpcpp/grpcpp.h>

#include <grpcpp/grpcpp.h>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "base/status_macros.h"
#include "client/cluster_client.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "serve/local_cluster.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

using ::kvc::testing::Daemon;
using ::kvc::testing::ReadFile;
using ::kvc::testing::TempDir;

constexpr char kRootPassword[] = "etcd-root-pw";

// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it.
void MakeCertificates(const TempDir& dir) {
  const std::string d = dir.path();
  std::ofstream(d + "/server.ext") << "subjectAltName=IP:127.0.0.1\n";
  const std::string cmd =
      "(cd " + d +
      " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kvcache-test-ca"
      " -keyout ca.key -out ca.pem"
      " && openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key"
      " -out server.csr"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1"
      " -extfile server.ext -out server.pem"
      " && openssl req -newkey rsa:2048 -nodes -subj /CN=kvcache-node -keyout client.key"
      " -out client.csr"
      " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1"
      " -out client.pem) >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl failed";
}

cluster::EtcdSecurity WithCert(const TempDir& dir) {
  cluster::EtcdSecurity s;
  s.ca_file = dir.File("ca.pem");
  s.cert_file = dir.File("client.pem");
  s.key_file = dir.File("client.key");
  return s;
}

absl::Status CanRead(const std::string& endpoint, const cluster::EtcdSecurity& s) {
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<cluster::Etcd> etcd, cluster::Etcd::Connect(endpoint, s));
  etcd->call_timeout_ms = 1500;
  return etcd->RangePrefix("/kvcache/").status();
}

// etcd's own recipe: a root user with the root role, then authentication on.
void EnableAuth(const std::string& endpoint, const TempDir& dir) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(dir.File("ca.pem"));
  ssl.pem_cert_chain = ReadFile(dir.File("client.pem"));
  ssl.pem_private_key = ReadFile(dir.File("client.key"));
  auto auth = etcdserverpb::Auth::NewStub(grpc::CreateChannel(endpoint, grpc::SslCredentials(ssl)));
  auto call = [](auto&& f) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return f(&ctx);
  };
  etcdserverpb::AuthUserAddRequest add;
  add.set_name("root");
  add.set_password(kRootPassword);
  etcdserverpb::AuthUserAddResponse added;
  grpc::Status s = call([&](auto* c) { return auth->UserAdd(c, add, &added); });
  ASSERT_TRUE(s.ok()) << s.error_message();
  etcdserverpb::AuthUserGrantRoleRequest grant;
  grant.set_user("root");
  grant.set_role("root");
  etcdserverpb::AuthUserGrantRoleResponse granted;
  s = call([&](auto* c) { return auth->UserGrantRole(c, grant, &granted); });
  ASSERT_TRUE(s.ok()) << s.error_message();
  etcdserverpb::AuthEnableResponse enabled;
  s = call(
      [&](auto* c) { return auth->AuthEnable(c, etcdserverpb::AuthEnableRequest(), &enabled); });
  ASSERT_TRUE(s.ok()) << s.error_message();
}

TEST(EtcdSecurityTest, OnlyTheRightCertificateAndPasswordReachASecuredEtcd) {
  TempDir dir;
  MakeCertificates(dir);
  serve::EtcdProcess etcd(dir.File("etcd"));
  etcd.UseTls(dir.File("server.pem"), dir.File("server.key"), dir.File("ca.pem"), WithCert(dir));
  ASSERT_TRUE(etcd.Start().ok());
  const std::string ep = etcd.endpoint();

  EXPECT_FALSE(CanRead(ep, {}).ok()) << "plaintext reached a TLS etcd";
  cluster::EtcdSecurity no_cert;
  no_cert.ca_file = dir.File("ca.pem");
  EXPECT_FALSE(CanRead(ep, no_cert).ok()) << "no client certificate, and etcd answered";
  EXPECT_TRUE(CanRead(ep, WithCert(dir)).ok());
  // Mistakes in the settings are named before anything is sent.
  cluster::EtcdSecurity half = WithCert(dir);
  half.key_file.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(CanRead(ep, half)));
  cluster::EtcdSecurity missing = WithCert(dir);
  missing.ca_file = dir.File("nope.pem");
  const absl::Status m = CanRead(ep, missing);
  EXPECT_NE(m.message().find("nope.pem"), std::string::npos) << m;

  EnableAuth(ep, dir);
  // The certificate alone names a user ("kvcache-node") that etcd does not have.
  EXPECT_FALSE(CanRead(ep, WithCert(dir)).ok());
  cluster::EtcdSecurity wrong = WithCert(dir);
  wrong.user = "root";
  wrong.password = "not-the-password";
  const absl::Status w = CanRead(ep, wrong);
  EXPECT_FALSE(w.ok());
  EXPECT_NE(w.message().find("user \"root\""), std::string::npos) << w;

  // Every call membership makes, as root.
  cluster::EtcdSecurity root = WithCert(dir);
  root.user = "root";
  root.password = kRootPassword;
  absl::StatusOr<std::unique_ptr<cluster::Etcd>> c = cluster::Etcd::Connect(ep, root);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<int64_t> lease = (*c)->GrantLease(10);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE((*c)->Put("/kvcache/v1/test/a", "1", *lease).ok());
  absl::StatusOr<int64_t> ttl = (*c)->KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  absl::StatusOr<cluster::Etcd::RangeResult> r = (*c)->RangePrefix("/kvcache/v1/test/");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->kvs.size(), 1u);
  std::atomic<int> events{0};
  std::thread watcher([&] {
    (void)(*c)->WatchPrefix("/kvcache/v1/test/", r->revision + 1,
                            [&](bool put, const cluster::Etcd::KeyValue&) { events += put; });
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (events == 0 && std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE((*c)->Put("/kvcache/v1/test/b", "2", 0).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  (*c)->CancelWatches();
  watcher.join();
  EXPECT_GT(events.load(), 0) << "the watch saw no put";
  EXPECT_TRUE((*c)->RevokeLease(*lease).ok());

  // A node registers through it, and the cluster client and kvctl find the node.
  std::ofstream(dir.File("password")) << kRootPassword << "\n";
  Daemon node(dir.File("node"),
              {"--cluster", etcd.url(), "--node-id", "n0", "--etcd-ca", dir.File("ca.pem"),
               "--etcd-cert", dir.File("client.pem"), "--etcd-key", dir.File("client.key"),
               "--etcd-user", "root", "--etcd-password-file", dir.File("password")});
  client::ClientOptions o;
  o.address = etcd.url();
  o.etcd = root;
  size_t members = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (members == 0 && std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<std::unique_ptr<client::ClusterClient>> client =
        client::ClusterClient::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    members = (*client)->membership()->nodes.size();
    if (members == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(members, 1u);
  const testing::ProcessResult stats = testing::RunProgram(
      std::string(KVC_BIN_DIR) + "/kvctl",
      {"--etcd-ca", dir.File("ca.pem"), "--etcd-cert", dir.File("client.pem"), "--etcd-key",
       dir.File("client.key"), "--etcd-user", "root", "--etcd-password-file", dir.File("password"),
       "stats", "--cluster", etcd.url()});
  EXPECT_EQ(stats.exit_code, 0) << stats.out << stats.err;
  EXPECT_NE(stats.out.find("cluster: 1 nodes"), std::string::npos) << stats.out << stats.err;
  // Without the password kvctl says what is missing.
  const testing::ProcessResult refused = testing::RunProgram(
      std::string(KVC_BIN_DIR) + "/kvctl",
      {"--etcd-ca", dir.File("ca.pem"), "--etcd-user", "root", "stats", "--cluster", etcd.url()});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--etcd-password-file"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace kvc
