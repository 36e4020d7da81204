// kvcached against what a hostile or broken client sends, on the real daemon: a Store
// stream with a message that does not parse, an enum value the protocol does not have,
// and a local user reading the data folder.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/support/sync_stream.h>
#include <sys/stat.h>

#include <grpcpp/grpcpp.h>
#include <filesystem>
#include <fstream>
#include <random>

#include "client/client.h"
#include "client/stats.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "tests/cachesvc/daemon.h"
#include "tests/cachesvc/random_prefix.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::client::CacheClient;
using ::kvc::client::ClientOptions;
using ::kvc::client::LookupResult;
using ::kvc::client::RemoteNamespace;

namespace pb = ::kvcache::v1;
using ::kvc::testing::Daemon;
using ::kvc::testing::MakePrefix;
using ::kvc::testing::Prefix;
using ::kvc::testing::ReadFile;
using ::kvc::testing::TempDir;

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

// Sends each element as one raw message of a Store stream; the call's status.
grpc::Status RawStore(const std::string& address, const std::vector<std::string>& messages) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::ByteBuffer response;
  const grpc::internal::RpcMethod method("/kvcache.v1.KVCache/Store",
                                         grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                    &response));
  for (const std::string& m : messages) {
    if (!writer->Write(Bytes(m))) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

// One raw unary call; its status (and the answer's bytes in *response).
grpc::Status RawUnary(const std::string& address, const std::string& method,
                      const std::string& token, const std::string& request,
                      grpc::ByteBuffer* response) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  const grpc::internal::RpcMethod m(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, channel);
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), m, &ctx, Bytes(request), response);
}

std::string StoreMessage(const RemoteNamespace& ns, const Prefix& p, size_t chunk,
                         const std::vector<storage::ChunkKey>& keys, int durability) {
  pb::StoreRequest r;
  r.set_namespace_id(ns.id);
  if (chunk > 0)
    r.set_parent_key(std::string(reinterpret_cast<const char*>(keys[chunk - 1].bytes.data()), 16));
  for (uint32_t t = 0; t < ns.chunk_tokens; ++t)
    r.add_tokens(p.tokens[chunk * ns.chunk_tokens + t]);
  r.set_payload(std::string(
      reinterpret_cast<const char*>(p.payloads.data()) + chunk * ns.chunk_bytes, ns.chunk_bytes));
  r.set_durability(static_cast<pb::Durability>(durability));
  return r.SerializeAsString();
}

class HostileClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rng_.seed(testing::FreshSeed());
    daemon_ = std::make_unique<Daemon>(dir_.File("data"));
    ClientOptions o;
    o.address = daemon_->address();
    client_ = *CacheClient::Connect(o);
    ns_ = *client_->RegisterNamespace(ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"),
                                      "mini", 64);
  }
  std::mt19937_64 rng_;
  TempDir dir_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<CacheClient> client_;
  RemoteNamespace ns_;
};

TEST_F(HostileClientTest, AStoreMessageThatDoesNotParseFailsTheCallNamingIt) {
  const Prefix p = MakePrefix(rng_, ns_, 3);
  const std::vector<storage::ChunkKey> keys = client_->Keys(ns_, p.tokens);
  const grpc::Status s =
      RawStore(daemon_->address(), {StoreMessage(ns_, p, 0, keys, pb::DURABILITY_DURABLE),
                                    std::string("\xff\xff\xff\xff\x0f", 5),
                                    StoreMessage(ns_, p, 1, keys, pb::DURABILITY_DURABLE)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("message 1: not a StoreRequest"), std::string::npos)
      << s.error_message();
  // The message before the bad one is stored; the bad one and the one after change nothing.
  absl::StatusOr<LookupResult> l = client_->Lookup(ns_, p.tokens);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->matched_chunks, 1u);
}

TEST_F(HostileClientTest, AnUnknownDurabilityIsRefused) {
  const Prefix p = MakePrefix(rng_, ns_, 1);
  const std::vector<storage::ChunkKey> keys = client_->Keys(ns_, p.tokens);
  const grpc::Status s = RawStore(daemon_->address(), {StoreMessage(ns_, p, 0, keys, 7)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("durability is 7"), std::string::npos) << s.error_message();
  EXPECT_EQ(client_->Lookup(ns_, p.tokens)->matched_chunks, 0u);
  // A well-formed stream still works.
  EXPECT_TRUE(RawStore(daemon_->address(), {StoreMessage(ns_, p, 0, keys, 1)}).ok());
  EXPECT_EQ(client_->Lookup(ns_, p.tokens)->matched_chunks, 1u);
}

TEST_F(HostileClientTest, NoOtherLocalUserCanReadTheDataFolder) {
  const Prefix p = MakePrefix(rng_, ns_, 4);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  // An older kvcached left a world-readable file: the next start closes it.
  const std::string stray = dir_.File("data") + "/index/LOG.old.readable";
  std::ofstream(stray) << "x";
  ::chmod(stray.c_str(), 0644);
  daemon_->Restart(SIGTERM);
  size_t files = 0;
  namespace fs = std::filesystem;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir_.File("data"))) {
    if (e.is_symlink() || e.is_socket()) continue;
    const fs::perms open =
        e.status().permissions() & (fs::perms::group_all | fs::perms::others_all);
    EXPECT_EQ(open, fs::perms::none) << e.path();
    files += e.is_regular_file();
  }
  EXPECT_GT(files, 5u);  // the index, the slabs, the registry
  const fs::perms top = fs::status(dir_.File("data")).permissions();
  EXPECT_EQ(top & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);
}

TEST(UnaryCallTest, GarbageIsInvalidArgumentAfterAuthenticationNeverBefore) {
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-a acme\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens")});
  const std::string garbage("\xff\xff\xff\xff\x0f", 5);
  for (const char* method :
       {"Lookup", "RegisterNamespace", "Pin", "Delete", "Stats", "FetchRefs", "ReleaseRefs"}) {
    const std::string path = std::string("/kvcache.v1.KVCache/") + method;
    grpc::ByteBuffer response;
    // Without a valid token: refused as unauthenticated, whatever the bytes.
    grpc::Status s = RawUnary(d.address(), path, "wrong", garbage, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << ": " << s.error_message();
    // With one: the bytes are the caller's mistake, named.
    s = RawUnary(d.address(), path, "tok-a", garbage, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("does not parse"), std::string::npos) << s.error_message();
  }
  // A well-formed raw request still gets its answer.
  grpc::ByteBuffer response;
  ASSERT_TRUE(RawUnary(d.address(), "/kvcache.v1.KVCache/Stats", "tok-a", "", &response).ok());
  pb::StatsResponse stats;
  ASSERT_TRUE(grpc::SerializationTraits<pb::StatsResponse>::Deserialize(&response, &stats).ok());
  EXPECT_GT(stats.ram_capacity_chunks(), 0u);
}

TEST(TenantStatsTest, ATenantSeesItsOwnCountsOnlyAndAnAdminSeesTotals) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-a acme\ntok-b globex\ntok-o ops\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--admin-tenants", "ops"});
  const auto connect = [&](const std::string& token) {
    ClientOptions o;
    o.address = d.address();
    o.bearer_token = token;
    return *CacheClient::Connect(o);
  };
  std::unique_ptr<CacheClient> a = connect("tok-a"), b = connect("tok-b"), ops = connect("tok-o");
  const std::string config = ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  const RemoteNamespace na = *a->RegisterNamespace(config, "mini", 64);
  const RemoteNamespace nb = *b->RegisterNamespace(config, "mini", 64);
  const Prefix pa = MakePrefix(rng, na, 3), pb = MakePrefix(rng, nb, 1);
  ASSERT_TRUE(a->Store(na, std::nullopt, pa.tokens, pa.payloads).ok());
  ASSERT_TRUE(b->Store(nb, std::nullopt, pb.tokens, pb.payloads).ok());
  std::vector<uint8_t> out(pa.payloads.size());
  ASSERT_EQ(*a->Fetch(na, a->Keys(na, pa.tokens), out), 3u);
  const pb::StatsResponse sa = *a->Stats(), sb = *b->Stats(), so = *ops->Stats();
  EXPECT_EQ(sa.ram_chunks(), 3u);
  EXPECT_EQ(sa.ssd_chunks(), 3u);
  EXPECT_EQ(sa.ram_hits() + sa.ssd_hits(), 3u);
  EXPECT_EQ(sb.ram_chunks(), 1u);
  EXPECT_EQ(sb.ssd_chunks(), 1u);
  EXPECT_EQ(sb.ram_hits() + sb.ssd_hits(), 0u) << "globex sees acme's fetches";
  EXPECT_EQ(so.ram_chunks(), 4u);  // the admin: every tenant's
  EXPECT_EQ(so.ssd_chunks(), 4u);
  EXPECT_GE(so.ram_hits() + so.ssd_hits(), 3u);
  EXPECT_EQ(sa.ram_capacity_chunks(), so.ram_capacity_chunks());
  EXPECT_GT(sa.ram_capacity_chunks(), 0u);
}

}  // namespace
}  // namespace kvc::cachesvc
