// The C++ client against the real daemon: local hashing agrees with the server, prefixes
// round-trip into caller buffers, a chunk missing mid-prefix ends a fetch cleanly, a
// truncated store stream keeps only whole messages, and 32 concurrent clients mixing
// store, lookup and fetch see no errors.
#include "client/client.h"
#include "client/prefix_hash.h"
#include "client/stats.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/spec/model_config.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/daemon.h"
#include "tests/cachesvc/random_prefix.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::client {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::testing::Daemon;
using ::kvc::testing::ReadFile;
using ::kvc::testing::TempDir;

using ::kvc::testing::MakePrefix;
using ::kvc::testing::Prefix;

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::FreshSeed();
    daemon_ = std::make_unique<Daemon>(dir_.File("data"));
    client_ = *CacheClient::Connect({.address = daemon_->address(),
                                     .bearer_token = "",
                                     .timeout_ms = 30000,
                                     .tls_ca_file = "",
                                     .shm_socket = ""});
    absl::StatusOr<RemoteNamespace> ns = client_->RegisterNamespace(
        ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"), "mini", 64);
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
  }
  uint64_t seed_ = 0;
  TempDir dir_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<CacheClient> client_;
  RemoteNamespace ns_;
};

TEST_F(ClientTest, PrefixRoundTripsAndLocalKeysMatchTheServer) {
  std::mt19937_64 rng(seed_);
  const Prefix p = MakePrefix(rng, ns_, 5);
  absl::StatusOr<StoreResult> stored = client_->Store(ns_, std::nullopt, p.tokens, p.payloads);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 5u);
  const std::vector<storage::ChunkKey> local = client_->Keys(ns_, p.tokens);
  EXPECT_EQ(stored->keys, local);
  absl::StatusOr<LookupResult> l = client_->Lookup(ns_, p.tokens);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->keys, local);
  EXPECT_EQ(l->matched_chunks, 5u);
  std::vector<uint8_t> out(p.payloads.size());
  absl::StatusOr<size_t> got = client_->Fetch(ns_, local, out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 5u);
  EXPECT_EQ(out, p.payloads);

  // Continue the prefix from its last chunk: only the new chunks are stored.
  const Prefix more = MakePrefix(rng, ns_, 2);
  absl::StatusOr<StoreResult> tail = client_->Store(ns_, local.back(), more.tokens, more.payloads);
  ASSERT_TRUE(tail.ok()) << tail.status();
  std::vector<uint32_t> all = p.tokens;
  all.insert(all.end(), more.tokens.begin(), more.tokens.end());
  EXPECT_EQ(client_->Lookup(ns_, all)->matched_chunks, 7u);
}

// A worker's prompt almost always ends mid-chunk: Store takes it as it is, stores the whole
// chunks and says how many tokens they cover; the tail follows once it is whole.
TEST_F(ClientTest, StoreKeepsTheWholeChunksAndSaysHowManyTokensTheyCover) {
  std::mt19937_64 rng(seed_);
  const Prefix p = MakePrefix(rng, ns_, 3);
  std::vector<uint32_t> tokens = p.tokens;
  const size_t tail = 1 + rng() % (ns_.chunk_tokens - 1);
  for (size_t i = 0; i < tail; ++i) tokens.push_back(static_cast<uint32_t>(rng() % 512));
  absl::StatusOr<StoreResult> stored = client_->Store(ns_, std::nullopt, tokens, p.payloads);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 3u);
  EXPECT_EQ(stored->tokens, 3u * ns_.chunk_tokens) << tail << "-token tail left out";
  EXPECT_EQ(stored->keys, client_->Keys(ns_, tokens));
  EXPECT_EQ(client_->Lookup(ns_, tokens)->matched_chunks, 3u);
  // Payload bytes for the partial chunk too are refused, naming the sizes.
  std::vector<uint8_t> too_many = p.payloads;
  too_many.resize(too_many.size() + ns_.chunk_bytes);
  absl::StatusOr<StoreResult> bad = client_->Store(ns_, std::nullopt, tokens, too_many);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("3 whole chunks"), std::string::npos) << bad.status();
}

TEST_F(ClientTest, LookupByKeysAgreesWithLookupByTokensAndRefusesBadInput) {
  std::mt19937_64 rng(seed_);
  const Prefix p = MakePrefix(rng, ns_, 4);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  const absl::StatusOr<ModelConfig> mini = ParseModelConfig(
      ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"), "configs/mini.json");
  ASSERT_TRUE(mini.ok()) << mini.status();
  const uint32_t vocab = static_cast<uint32_t>(mini->vocab_size);
  EXPECT_EQ(ns_.vocab_size, vocab) << "RegisterNamespace tells the vocabulary";
  // Tokens past the cached prefix: the client sends keys, the server hashes nothing.
  std::vector<uint32_t> longer = p.tokens;
  for (int i = 0; i < 2 * 64; ++i) longer.push_back(static_cast<uint32_t>(rng() % vocab));
  pb::LookupRequest by_tokens;
  by_tokens.set_namespace_id(ns_.id);
  by_tokens.mutable_tokens()->Add(longer.begin(), longer.end());
  pb::LookupResponse want;
  grpc::ClientContext c1;
  ASSERT_TRUE(daemon_->stub().Lookup(&c1, by_tokens, &want).ok());
  absl::StatusOr<LookupResult> got = client_->Lookup(ns_, longer);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->matched_chunks, want.matched_chunks());
  EXPECT_EQ(got->matched_chunks, 4u);
  ASSERT_EQ(got->keys.size(), static_cast<size_t>(want.chunk_keys_size()));
  for (size_t i = 0; i < got->keys.size(); ++i) {
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->keys[i].bytes.data()), 16),
              want.chunk_keys(static_cast<int>(i)));
  }
  // A bad token is refused before any call, as the server would.
  longer[70] = vocab + 88;
  absl::StatusOr<LookupResult> bad = client_->Lookup(ns_, longer);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find(
                absl::StrCat("tokens[70] is ", vocab + 88, ", outside the vocabulary of ", vocab)),
            std::string::npos)
      << bad.status();
  // The server: a key that is not 16 bytes, or tokens and keys at once.
  pb::LookupRequest wrong;
  wrong.set_namespace_id(ns_.id);
  wrong.add_chunk_keys(std::string(15, 'k'));
  pb::LookupResponse ignored;
  grpc::ClientContext c2;
  grpc::Status s = daemon_->stub().Lookup(&c2, wrong, &ignored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("chunk_keys[0] is 15 bytes"), std::string::npos)
      << s.error_message();
  wrong.set_chunk_keys(0, std::string(16, 'k'));
  wrong.add_tokens(1);
  grpc::ClientContext c3;
  s = daemon_->stub().Lookup(&c3, wrong, &ignored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("one of tokens, chunk_keys and packed_chunk_keys"),
            std::string::npos)
      << s.error_message();
  // Packed keys: the answer says how many it saw; a length that is not whole keys, or
  // packed and unpacked keys at once, are refused.
  pb::LookupRequest packed;
  packed.set_namespace_id(ns_.id);
  packed.set_every_chunk(true);
  for (const storage::ChunkKey& k : got->keys) {
    packed.mutable_packed_chunk_keys()->append(reinterpret_cast<const char*>(k.bytes.data()), 16);
  }
  pb::LookupResponse packed_answer;
  grpc::ClientContext c4;
  ASSERT_TRUE(daemon_->stub().Lookup(&c4, packed, &packed_answer).ok());
  EXPECT_EQ(packed_answer.keys_seen(), got->keys.size());
  EXPECT_EQ(packed_answer.matched_chunks(), 4u);
  ASSERT_EQ(packed_answer.tiers_size(), static_cast<int>(got->keys.size()));
  EXPECT_EQ(packed_answer.tiers(4), pb::TIER_NONE);
  packed.mutable_packed_chunk_keys()->push_back('x');
  grpc::ClientContext c5;
  s = daemon_->stub().Lookup(&c5, packed, &ignored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not a whole number of 16-byte keys"), std::string::npos)
      << s.error_message();
  packed.mutable_packed_chunk_keys()->pop_back();
  packed.add_chunk_keys(std::string(16, 'k'));
  grpc::ClientContext c6;
  s = daemon_->stub().Lookup(&c6, packed, &ignored);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
}

// A daemon from before packed keys: Lookup reads chunk_keys only and never sets keys_seen.
class UnpackedOnlyLookup final : public pb::KVCache::Service {
 public:
  grpc::Status Lookup(grpc::ServerContext*, const pb::LookupRequest* req,
                      pb::LookupResponse* resp) override {
    ++calls;
    // "Cached": every key whose first byte is even.
    for (const std::string& k : req->chunk_keys()) {
      resp->add_tiers((static_cast<uint8_t>(k[0]) % 2 == 0) ? pb::TIER_RAM : pb::TIER_NONE);
    }
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

TEST(ClientCompatibilityTest, LookupByKeysAsksAnOlderDaemonWithOneStringPerKey) {
  UnpackedOnlyLookup old_daemon;
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&old_daemon);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ClientOptions o;
  o.address = "127.0.0.1:" + std::to_string(port);
  std::unique_ptr<CacheClient> client = *CacheClient::Connect(o);
  std::mt19937_64 rng(testing::FreshSeed());
  std::vector<storage::ChunkKey> keys(9);
  for (storage::ChunkKey& k : keys) {
    for (uint8_t& byte : k.bytes) byte = static_cast<uint8_t>(rng());
  }
  RemoteNamespace ns;
  ns.id = 1;
  absl::StatusOr<LookupResult> r = client->LookupKeysEvery(ns, keys);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(old_daemon.calls.load(), 2) << "packed first, then one string per key";
  ASSERT_EQ(r->tiers.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(r->tiers[i], keys[i].bytes[0] % 2 == 0 ? client::Tier::kRam : client::Tier::kNone)
        << i;
  }
  server->Shutdown();
}

TEST_F(ClientTest, ChunkMissingMidPrefixEndsTheFetchThere) {
  std::mt19937_64 rng(seed_);
  const Prefix p = MakePrefix(rng, ns_, 4);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  const std::vector<storage::ChunkKey> keys = client_->Keys(ns_, p.tokens);
  ASSERT_EQ(*client_->Delete(ns_, std::span(keys).subspan(2, 1)), 1u);  // "evicted since Lookup"
  std::vector<uint8_t> out(p.payloads.size());
  absl::StatusOr<size_t> got = client_->Fetch(ns_, keys, out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 2u);
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 2 * ns_.chunk_bytes, p.payloads.begin()));
}

// Established TCP connections in this network namespace whose remote end is `port`
// (gRPC's sockets are IPv6 ones, carrying IPv4 addresses mapped: /proc/net/tcp6 too).
int ConnectionsTo(int port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "01" && std::stoi(remote.substr(remote.find(':') + 1), nullptr, 16) == port) ++n;
    }
  }
  return n;
}

// Clients of one process to one daemon do not share a connection (gRPC's default would
// give them one, and 8 clients then moved less than 8 connections do).
TEST_F(ClientTest, EachClientHasAConnectionOfItsOwn) {
  const int port = daemon_->port();
  ASSERT_TRUE(client_->Stats().ok());
  const int before = ConnectionsTo(port);
  ASSERT_GE(before, 1);
  std::vector<std::unique_ptr<CacheClient>> more;
  for (int i = 0; i < 3; ++i) {
    ClientOptions o;
    o.address = daemon_->address();
    more.push_back(*CacheClient::Connect(o));
    ASSERT_TRUE(more.back()->Stats().ok());
  }
  EXPECT_EQ(ConnectionsTo(port), before + 3);
}

TEST_F(ClientTest, TruncatedStoreStreamKeepsOnlyWholeMessages) {
  std::mt19937_64 rng(seed_);
  // Memory-durability chunks are stored message by message; durable ones in batches (one
  // group commit for several), which a stream that ends — here, cancelled — stores too.
  for (const pb::Durability durability : {pb::DURABILITY_MEMORY, pb::DURABILITY_DURABLE}) {
    SCOPED_TRACE(pb::Durability_Name(durability));
    const Prefix p = MakePrefix(rng, ns_, 3);
    // Two complete messages, then the client gives up without WritesDone.
    {
      grpc::ClientContext ctx;
      pb::StoreResponse resp;
      auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
      auto stub = pb::KVCache::NewStub(channel);
      auto writer = stub->Store(&ctx, &resp);
      const std::vector<storage::ChunkKey> keys = client_->Keys(ns_, p.tokens);
      for (int i = 0; i < 2; ++i) {
        pb::StoreRequest req;
        req.set_namespace_id(ns_.id);
        if (i > 0)
          req.set_parent_key(std::string(reinterpret_cast<const char*>(keys[0].bytes.data()), 16));
        req.mutable_tokens()->Add(p.tokens.begin() + i * ns_.chunk_tokens,
                                  p.tokens.begin() + (i + 1) * ns_.chunk_tokens);
        req.set_payload(p.payloads.data() + i * ns_.chunk_bytes, ns_.chunk_bytes);
        req.set_durability(durability);
        ASSERT_TRUE(writer->Write(req));
      }
      // Wait until the server has the two (memory: stored; durable: staged — give it the
      // time to read them), then give up on the stream.
      if (durability == pb::DURABILITY_MEMORY) {
        for (int i = 0; i < 100 && client_->Lookup(ns_, p.tokens)->matched_chunks < 2; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      ctx.TryCancel();
      EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
    }
    for (int i = 0; i < 100 && client_->Lookup(ns_, p.tokens)->matched_chunks < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a staged batch's commit
    }
    absl::StatusOr<LookupResult> l = client_->Lookup(ns_, p.tokens);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->matched_chunks, 2u);
    std::vector<uint8_t> out(2 * ns_.chunk_bytes);
    ASSERT_EQ(*client_->Fetch(ns_, std::span(l->keys).first(2), out), 2u);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), p.payloads.begin()));
  }
}

TEST_F(ClientTest, ThirtyTwoConcurrentClientsMixingCallsSeeNoErrors) {
  constexpr int kClients = 32;
  // Under ThreadSanitizer (scripts/race-check.sh) both processes run 5–20× slower, and on a
  // loaded 2-core machine a call queued behind 31 others can pass 30 s.
#if defined(__SANITIZE_THREAD__)
  constexpr int kCallTimeoutMs = 180000;
#else
  constexpr int kCallTimeoutMs = 30000;
#endif
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  std::atomic<int> errors{0}, fetched{0}, stored{0};
  std::mutex first_errors_mu;
  std::vector<std::string> first_errors;  // what went wrong, for the failure message
  auto error = [&](const std::string& what) {
    ++errors;
    std::lock_guard lock(first_errors_mu);
    if (first_errors.size() < 8) first_errors.push_back(what);
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(seed_ + c);
      std::unique_ptr<CacheClient> client = *CacheClient::Connect({.address = daemon_->address(),
                                                                   .bearer_token = "",
                                                                   .timeout_ms = kCallTimeoutMs,
                                                                   .tls_ca_file = "",
                                                                   .shm_socket = ""});
      // Clients share some prefixes (seed c % 4), so stores race on the same chunks.
      std::mt19937_64 shared(seed_ + c % 4);
      const Prefix p = MakePrefix(shared, ns_, 3);
      const std::vector<storage::ChunkKey> keys = client->Keys(ns_, p.tokens);
      std::vector<uint8_t> out(p.payloads.size());
      while (std::chrono::steady_clock::now() < deadline) {
        switch (rng() % 3) {
          case 0: {
            auto r = client->Store(
                ns_, std::nullopt, p.tokens, p.payloads,
                rng() % 2 ? client::Durability::kDurable : client::Durability::kMemory);
            if (!r.ok())
              error("Store: " + r.status().ToString());
            else
              stored += static_cast<int>(r->stored);
            break;
          }
          case 1:
            if (absl::StatusOr<LookupResult> l = client->Lookup(ns_, p.tokens); !l.ok())
              error("Lookup: " + l.status().ToString());
            break;
          default: {
            absl::StatusOr<size_t> n = client->Fetch(ns_, keys, out);
            if (!n.ok()) {
              error("Fetch: " + n.status().ToString());
            } else if (!std::equal(out.begin(), out.begin() + *n * ns_.chunk_bytes,
                                   p.payloads.begin())) {
              error("Fetch: wrong bytes in " + std::to_string(*n) + " chunks");
            } else {
              fetched += static_cast<int>(*n);
            }
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::printf("load: %d chunks fetched, %d stored by 32 clients in 4 s\n", fetched.load(),
              stored.load());
  EXPECT_EQ(errors.load(), 0) << absl::StrJoin(first_errors, "\n");
  EXPECT_GT(fetched.load(), 0);
  EXPECT_GE(stored.load(), 3 * 4);  // each distinct prefix stored once
  absl::StatusOr<pb::StatsResponse> st = client_->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_LE(st->ram_chunks(), st->ram_capacity_chunks());
  // Memory stays bounded: the RAM tier is a few MiB here; what the daemon holds beyond it
  // (gRPC buffers, one chunk per open stream, RocksDB, the executor queue) is bounded too.
  const long rss = daemon_->rss_kib();
  std::printf("kvcached resident memory after the load: %ld KiB\n", rss);
  EXPECT_GT(rss, 0);
#if defined(__SANITIZE_ADDRESS__)
  constexpr long kLimitKiB = 1024 * 1024;  // ASan's shadow and quarantine hold freed memory
#else
  constexpr long kLimitKiB = 256 * 1024;
#endif
  EXPECT_LT(rss, kLimitKiB);
}

// 127.0.0.1:port, for bind and connect (port 0: one the kernel picks).
sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// The port of a bound socket (0 if getsockname fails).
int BoundPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? ntohs(a.sin_port) : 0;
}

// A TCP forwarder between a client and the daemon that closes the first `drop` connections
// it accepts, as soon as it accepts them: a connection attempt that fails (one did, among
// 32 clients connecting at once on a loaded machine, and gRPC then failed ~30,000 calls in
// the following 4 s).
class DroppingProxy {
 public:
  DroppingProxy(int to_port, int drop) : to_port_(to_port), drop_(drop) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_in any = Loopback(0);
    if (bind(listener_, reinterpret_cast<const sockaddr*>(&any), sizeof any) != 0 ||
        listen(listener_, 64) != 0 || (port_ = BoundPort(listener_)) == 0) {
      std::perror("proxy listen");
      std::abort();
    }
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~DroppingProxy() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      for (int fd : open_) shutdown(fd, SHUT_RDWR);
    }
    shutdown(listener_, SHUT_RDWR);
    accept_thread_.join();  // then nobody adds copiers
    for (std::thread& t : copiers_) t.join();
    close(listener_);
    for (int fd : open_) close(fd);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_.load(); }

 private:
  void AcceptLoop() {
    for (;;) {
      const int in = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (in < 0) return;  // shut down
      if (++accepted_ <= drop_) {
        close(in);
        continue;
      }
      const int out = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const sockaddr_in daemon = Loopback(to_port_);
      if (connect(out, reinterpret_cast<const sockaddr*>(&daemon), sizeof daemon) != 0) {
        close(in);
        close(out);
        continue;
      }
      std::lock_guard lock(mu_);
      if (stopping_) {
        close(in);
        close(out);
        return;
      }
      open_.push_back(in);
      open_.push_back(out);
      copiers_.emplace_back([in, out] { Copy(in, out); });
      copiers_.emplace_back([in, out] { Copy(out, in); });
    }
  }
  // Bytes from `from` to `to` until `from` ends; then `to` hears the end too. MSG_NOSIGNAL:
  // a peer that already closed (the client's channel, destroyed first) must not SIGPIPE the
  // test, which would leave its daemon running and ctest waiting on the daemon's stderr.
  static void Copy(int from, int to) {
    std::vector<char> buf(64 << 10);
    for (ssize_t n; (n = read(from, buf.data(), buf.size())) > 0;) {
      for (ssize_t off = 0; off < n;) {
        const ssize_t w = send(to, buf.data() + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
        if (w <= 0) return;
        off += w;
      }
    }
    shutdown(to, SHUT_WR);
  }

  const int to_port_;
  const int drop_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::mutex mu_;
  bool stopping_ = false;             // guarded by mu_
  std::vector<int> open_;             // guarded by mu_
  std::vector<std::thread> copiers_;  // guarded by mu_ while the accept loop runs
  std::thread accept_thread_;
};

// A connection attempt that fails costs no call: the client connects again within
// milliseconds and the call is tried again on the new connection (client/channel_args.h),
// where gRPC alone would fail every call until its next attempt a second later.
TEST_F(ClientTest, AFailedConnectionAttemptCostsNoCall) {
  std::mt19937_64 rng(seed_);
  const Prefix p = MakePrefix(rng, ns_, 3);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  DroppingProxy proxy(daemon_->port(), /*drop=*/2);
  ClientOptions o;
  o.address = proxy.address();
  std::unique_ptr<CacheClient> c = *CacheClient::Connect(o);
  const std::vector<storage::ChunkKey> keys = c->Keys(ns_, p.tokens);
  std::vector<uint8_t> out(p.payloads.size());
  absl::StatusOr<size_t> n = c->Fetch(ns_, keys, out);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(out, p.payloads);
  EXPECT_EQ(proxy.accepted(), 3) << "two connections dropped, the third carried the call";
}

// Retrying does not turn a daemon that is down into a call that waits for its deadline:
// it fails UNAVAILABLE, naming the address, after the retries (0.7 s here), long before it.
TEST(ClientDownTest, ACallToADaemonThatIsDownFailsSoonNamingTheAddress) {
  // A port bound and not listening: connects are refused, and no server another test
  // starts meanwhile can take it.
  const int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_in any = Loopback(0);
  ASSERT_EQ(bind(held, reinterpret_cast<const sockaddr*>(&any), sizeof any), 0);
  const std::string address = "127.0.0.1:" + std::to_string(BoundPort(held));
  ClientOptions o;
  o.address = address;
  o.timeout_ms = 30000;
  std::unique_ptr<CacheClient> c = *CacheClient::Connect(o);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<pb::StatsResponse> st = c->Stats();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(absl::IsUnavailable(st.status())) << st.status();
  EXPECT_NE(st.status().message().find(address), std::string::npos) << st.status();
  EXPECT_LT(seconds, 10.0) << "waited toward the 30 s deadline";
  close(held);
}

TEST_F(ClientTest, CoLocatedClientReadsChunksFromSharedMemory) {
  std::mt19937_64 rng(seed_);
  ClientOptions o;
  o.address = daemon_->address();
  o.shm_socket = dir_.File("data") + "/kvcached.sock";
  absl::StatusOr<std::unique_ptr<CacheClient>> local = CacheClient::Connect(o);
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE((*local)->shared_memory()) << (*local)->shared_memory_error();
  const Prefix p = MakePrefix(rng, ns_, 4);
  ASSERT_TRUE((*local)->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  const std::vector<storage::ChunkKey> keys = (*local)->Keys(ns_, p.tokens);
  std::vector<uint8_t> out(p.payloads.size());
  const uint64_t ram_hits_before = client_->Stats()->ram_hits();
  absl::StatusOr<size_t> got = (*local)->Fetch(ns_, keys, out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 4u);
  EXPECT_EQ(out, p.payloads);
  EXPECT_EQ(client_->Stats()->ram_hits(), ram_hits_before + 4);
  // Within the lease, fetching the prefix again is a copy from shared memory with no call
  // to the server at all (its hit counter does not move); without the lease cache every
  // fetch asks the server.
  std::fill(out.begin(), out.end(), 0);
  ASSERT_EQ(*(*local)->Fetch(ns_, keys, out), 4u);
  EXPECT_EQ(out, p.payloads);
  EXPECT_EQ(client_->Stats()->ram_hits(), ram_hits_before + 4);
  ClientOptions uncached = o;
  uncached.shm_lease_cache = false;
  std::unique_ptr<CacheClient> asking = *CacheClient::Connect(uncached);
  ASSERT_TRUE(asking->shared_memory());
  for (int i = 0; i < 2; ++i) ASSERT_EQ(*asking->Fetch(ns_, keys, out), 4u);
  EXPECT_EQ(out, p.payloads);
  EXPECT_EQ(client_->Stats()->ram_hits(), ram_hits_before + 12);
  // A missing chunk mid-prefix ends the fetch there, on this path too.
  ASSERT_EQ(*(*local)->Delete(ns_, std::span(keys).subspan(1, 1)), 1u);
  got = (*local)->Fetch(ns_, keys, out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 1u);
}

// A co-located client of `d` (its shared arena mapped) and the mini namespace.
struct CoLocated {
  std::unique_ptr<CacheClient> client;
  RemoteNamespace ns;
};
CoLocated ConnectCoLocated(const Daemon& d, const TempDir& dir, uint32_t lease_ms) {
  ClientOptions o;
  o.address = d.address();
  o.shm_socket = dir.File("data") + "/kvcached.sock";
  o.lease_ms = lease_ms;
  CoLocated c{*CacheClient::Connect(o), {}};
  EXPECT_TRUE(c.client->shared_memory()) << c.client->shared_memory_error();
  c.ns = *c.client->RegisterNamespace(ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"),
                                      "mini", 64);
  return c;
}

// Flips one bit of the daemon's RAM copy at `arena_offset` of pool 0, writing its memory as
// a DRAM fault would (through /proc/PID/mem: the test is the daemon's parent).
void FlipBitInDaemonRam(pid_t pid, uint64_t arena_offset, int bit) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  uint64_t base = 0;
  while (std::getline(maps, line)) {
    // "start-end rw-s offset dev inode /memfd:kvcache-ram-pool-0 (deleted)"
    if (line.find("kvcache-ram-pool-0") == std::string::npos ||
        line.find(" rw-s ") == std::string::npos)
      continue;
    base = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    break;
  }
  ASSERT_NE(base, 0u) << "no writable mapping of the daemon's RAM arena";
  const int fd = open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << "open /proc/" << pid << "/mem: " << strerror(errno);
  uint8_t b = 0;
  const off_t at = static_cast<off_t>(base + arena_offset);
  ASSERT_EQ(pread(fd, &b, 1, at), 1);
  b ^= static_cast<uint8_t>(1u << bit);
  ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
  close(fd);
}

// A co-located client copies a prefix again from the leases it holds without asking the
// daemon. When the daemon's RAM scrub has since found one of those chunks corrupt, that
// copy must not be used: the daemon raised its arena's verdict count, the client reads it
// before reusing a held lease, asks again, and the prefix comes back right (from SSD).
TEST(ClientSharedMemoryTest, AHeldLeaseNeverHandsOutAChunkTheScrubFoundCorrupt) {
  const uint64_t seed = testing::FreshSeed();
  std::mt19937_64 rng(seed);
  TempDir dir;
  Daemon d(dir.File("data"), {"--ram-scrub-mbps", "200"});
  CoLocated c = ConnectCoLocated(d, dir, 60000);
  ASSERT_TRUE(c.client->shared_memory());
  std::unique_ptr<CacheClient>& local = c.client;
  const RemoteNamespace& ns = c.ns;
  const Prefix p = MakePrefix(rng, ns, 4);
  ASSERT_TRUE(local->Store(ns, std::nullopt, p.tokens, p.payloads).ok());  // durable: on SSD too
  const std::vector<storage::ChunkKey> keys = local->Keys(ns, p.tokens);
  std::vector<uint8_t> out(p.payloads.size());
  ASSERT_EQ(*local->Fetch(ns, keys, out), 4u);  // leases held from here on
  ASSERT_EQ(out, p.payloads);

  // Where the victim lies in the arena, asked the way the client asks.
  const size_t victim = seed % keys.size();
  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  auto stub = pb::KVCache::NewStub(channel);
  pb::FetchRefsRequest req;
  req.set_namespace_id(ns.id);
  for (const auto& k : keys) req.add_chunk_keys(std::string(k.bytes.begin(), k.bytes.end()));
  pb::FetchRefsResponse refs;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->FetchRefs(&ctx, req, &refs).ok());
  ASSERT_EQ(refs.refs_size(), 4);
  EXPECT_NE(refs.refs(victim).checksum(), 0u) << "FetchRefs names each chunk's checksum";
  const uint64_t at = refs.refs(victim).arena_offset() + (seed >> 8) % ns.chunk_bytes;
  FlipBitInDaemonRam(d.pid(), at, static_cast<int>((seed >> 4) % 8));
  std::printf("flipped a bit of chunk %zu at arena offset %llu\n", victim,
              static_cast<unsigned long long>(at));

  // The scrub finds it and drops the RAM copy.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (local->Stats()->ram_checksum_failures() == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const pb::StatsResponse st = *local->Stats();
  ASSERT_EQ(st.ram_checksum_failures(), 1u) << "the scrub never found the flipped bit";
  EXPECT_GT(st.ram_scrub_bytes(), 0u);
  EXPECT_GT(st.ram_scrub_passes(), 0u);
  // Within the lease the client would copy the prefix out of shared memory with no call;
  // the corrupt chunk's copy does not verify, so it asks, and gets the SSD copy.
  std::fill(out.begin(), out.end(), 0);
  absl::StatusOr<size_t> got = local->Fetch(ns, keys, out);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 4u);
  EXPECT_EQ(out, p.payloads) << "a held lease handed out the corrupt chunk";
}

// A long-lived co-located client across a kvcached restart: the new daemon's offsets are
// into a new arena, so the client must map that one and never read them from the old.
TEST(ClientSharedMemoryTest, AClientOutlivingARestartMapsTheNewArena) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  const int port = testing::FreeLoopbackPort();
  Daemon d(dir.File("data"), {"--listen", "127.0.0.1:" + std::to_string(port)});
  const std::string address = d.address();
  CoLocated c = ConnectCoLocated(d, dir, 200);
  ASSERT_TRUE(c.client->shared_memory());
  std::unique_ptr<CacheClient>& local = c.client;
  const RemoteNamespace ns = c.ns;
  const Prefix p = MakePrefix(rng, ns, 3);
  ASSERT_TRUE(local->Store(ns, std::nullopt, p.tokens, p.payloads).ok());
  const std::vector<storage::ChunkKey> keys = local->Keys(ns, p.tokens);
  std::vector<uint8_t> out(p.payloads.size());
  ASSERT_EQ(*local->Fetch(ns, keys, out), 3u);
  ASSERT_EQ(out, p.payloads);

  d.Restart(SIGTERM);  // same address, a new RAM arena
  ASSERT_EQ(d.address(), address);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // held leases end
  // In the new daemon other chunks take the first RAM slots, then a plain gRPC fetch
  // brings the prefix into RAM at other offsets than before the restart.
  ClientOptions plain;
  plain.address = address;
  std::unique_ptr<CacheClient> other = *CacheClient::Connect(plain);
  const Prefix filler = MakePrefix(rng, ns, 2);
  ASSERT_TRUE(
      other->Store(ns, std::nullopt, filler.tokens, filler.payloads, client::Durability::kMemory)
          .ok());
  std::vector<uint8_t> via_grpc(p.payloads.size());
  ASSERT_EQ(*other->Fetch(ns, keys, via_grpc), 3u);
  std::fill(out.begin(), out.end(), 0);
  ASSERT_EQ(*local->Fetch(ns, keys, out), 3u);
  EXPECT_EQ(out, p.payloads) << "read the new daemon's offsets from the old arena";
  EXPECT_TRUE(local->shared_memory()) << local->shared_memory_error();
}

TEST(ClientSharedMemoryTest, TenantsNotTrustedWithTheArenaFallBackToGrpc) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-a acme\ntok-b globex\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--shm-tenants", "acme"});
  const std::string socket = dir.File("data") + "/kvcached.sock";
  ClientOptions trusted;
  trusted.address = d.address();
  trusted.bearer_token = "tok-a";
  trusted.shm_socket = socket;
  ClientOptions other = trusted;
  other.bearer_token = "tok-b";
  ClientOptions nobody = trusted;
  nobody.bearer_token = "wrong";
  std::unique_ptr<CacheClient> a = *CacheClient::Connect(trusted), b = *CacheClient::Connect(other),
                               x = *CacheClient::Connect(nobody);
  EXPECT_TRUE(a->shared_memory()) << a->shared_memory_error();
  EXPECT_FALSE(b->shared_memory());
  EXPECT_NE(b->shared_memory_error().find("tenant may not map"), std::string::npos)
      << b->shared_memory_error();
  EXPECT_FALSE(x->shared_memory());
  EXPECT_NE(x->shared_memory_error().find("unknown bearer token"), std::string::npos)
      << x->shared_memory_error();
  // The refused client still works, over gRPC.
  absl::StatusOr<RemoteNamespace> ns = b->RegisterNamespace(
      ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"), "mini", 64);
  ASSERT_TRUE(ns.ok()) << ns.status();
  const Prefix p = MakePrefix(rng, *ns, 2);
  ASSERT_TRUE(b->Store(*ns, std::nullopt, p.tokens, p.payloads).ok());
  std::vector<uint8_t> out(p.payloads.size());
  EXPECT_EQ(*b->Fetch(*ns, b->Keys(*ns, p.tokens), out), 2u);
  EXPECT_EQ(out, p.payloads);
}

// Without --hbm-bytes there is no device tier: a precise FAILED_PRECONDITION. Asking for
// one on a device that does not exist stops kvcached at start with one clear line.
TEST_F(ClientTest, DeviceRefsNeedAnHbmTier) {
  std::mt19937_64 rng(seed_);
  const Prefix p = MakePrefix(rng, ns_, 2);
  ASSERT_TRUE(client_->Store(ns_, std::nullopt, p.tokens, p.payloads).ok());
  absl::StatusOr<DeviceRefs> refs = client_->FetchDeviceRefs(ns_, client_->Keys(ns_, p.tokens));
  ASSERT_FALSE(refs.ok());
  EXPECT_EQ(refs.status().code(), absl::StatusCode::kFailedPrecondition) << refs.status();
  EXPECT_NE(refs.status().message().find("--hbm-bytes"), std::string::npos) << refs.status();
  const testing::ProcessResult r = testing::RunProgram(
      testing::kDaemon, {"--data-dir", dir_.File("other"), "--listen", "127.0.0.1:0", "--hbm-bytes",
                         "67108864", "--hbm-device", "99"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("kvcached: error: --hbm-bytes: "), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace kvc::client

namespace kvc::client {
namespace {

// Caller-keyed namespaces (a serving engine's own page hashes as keys): pages round-trip
// byte-exact under keys of any bytes, survive a SIGKILL (durable stores), and are bound to
// the tenant whatever keys it picks — another tenant choosing the same caller keys, or
// replaying the first tenant's 16-byte chunk keys, neither sees nor overwrites them.
TEST(CallerKeyedNamespaceTest, PagesRoundTripSurviveACrashAndStayWithTheirTenant) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "tok-a acme\ntok-b globex\n";
  const int port = FreeLoopbackPort();
  Daemon d(dir.File("data"),
           {"--auth-tokens", dir.File("tokens"), "--listen", "127.0.0.1:" + std::to_string(port)});
  ClientOptions oa;
  oa.address = d.address();
  oa.bearer_token = "tok-a";
  ClientOptions ob = oa;
  ob.bearer_token = "tok-b";
  std::unique_ptr<CacheClient> a = *CacheClient::Connect(oa), b = *CacheClient::Connect(ob);
  const uint64_t page_bytes = 1000 + rng() % 5000;
  absl::StatusOr<RemoteNamespace> na = a->RegisterKeyedNamespace("sglang/m", page_bytes, 64);
  ASSERT_TRUE(na.ok()) << na.status();
  EXPECT_TRUE(na->caller_keys);
  EXPECT_EQ(na->chunk_bytes, page_bytes);
  EXPECT_EQ(na->root, CallerNamespaceRoot("acme", "sglang/m", page_bytes, 64));
  const RemoteNamespace nb = *b->RegisterKeyedNamespace("sglang/m", page_bytes, 64);

  constexpr size_t kPages = 4;
  std::vector<std::string> caller(kPages);
  std::vector<ChunkKey> keys;
  for (std::string& k : caller) {
    k.resize(1 + rng() % kMaxCallerKeyBytes);
    for (char& c : k) c = static_cast<char>(rng());
    keys.push_back(*CallerKey(*na, k));
  }
  std::vector<uint8_t> pages(kPages * page_bytes);
  for (uint8_t& x : pages) x = static_cast<uint8_t>(rng());
  std::vector<ChunkToStore> chunks(kPages);
  for (size_t i = 0; i < kPages; ++i) {
    chunks[i].key = keys[i];
    chunks[i].parent = i ? std::optional(keys[i - 1]) : std::nullopt;
    chunks[i].payload = std::span(pages).subspan(i * page_bytes, page_bytes);
  }
  absl::StatusOr<StoreResult> stored = a->StoreChunks(*na, chunks, Durability::kDurable, 0);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, kPages);
  EXPECT_EQ(stored->keys, keys);

  // The leading run answers (an engine's batch_exists): a missing third page ends it.
  std::vector<ChunkKey> asked = keys;
  asked.insert(asked.begin() + 2, *CallerKey(*na, "not stored"));
  EXPECT_EQ(a->LookupKeys(*na, asked)->matched_chunks, 2u);

  // The other tenant: its own keys for the same caller keys, and acme's chunk keys
  // replayed, both miss; its stores under them leave acme's pages as they were.
  std::vector<ChunkKey> b_keys;
  for (const std::string& k : caller) b_keys.push_back(*CallerKey(nb, k));
  EXPECT_NE(b_keys, keys);
  EXPECT_EQ(b->LookupKeys(nb, b_keys)->matched_chunks, 0u);
  EXPECT_EQ(b->LookupKeys(nb, keys)->matched_chunks, 0u);
  std::vector<uint8_t> other(pages.size(), 0x5A);
  for (size_t i = 0; i < kPages; ++i) {
    chunks[i].key = keys[i];
    chunks[i].payload = std::span(other).subspan(i * page_bytes, page_bytes);
  }
  ASSERT_TRUE(b->StoreChunks(nb, chunks, Durability::kDurable, 0).ok());

  d.Restart(SIGKILL);
  a = *CacheClient::Connect(oa);
  // The first call may meet the connection the crash closed; the client's caller retries.
  absl::StatusOr<RemoteNamespace> reopened;
  for (int i = 0; i < 50; ++i) {
    reopened = a->RegisterKeyedNamespace("sglang/m", page_bytes, 64);
    if (reopened.ok() || reopened.status().code() != absl::StatusCode::kUnavailable) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  const RemoteNamespace again = *reopened;
  EXPECT_EQ(again.id, na->id);
  EXPECT_EQ(again.root, na->root);
  EXPECT_TRUE(again.caller_keys) << "the mode survives the restart";
  std::vector<uint8_t> out(pages.size());
  ASSERT_EQ(*a->Fetch(again, keys, out), kPages);
  EXPECT_EQ(out, pages);
}

TEST(CallerKeyedNamespaceTest, EachModeRefusesTheOthersCallsNamingWhy) {
  TempDir dir;
  Daemon d(dir.File("data"));
  ClientOptions o;
  o.address = d.address();
  std::unique_ptr<CacheClient> c = *CacheClient::Connect(o);
  const RemoteNamespace keyed = *c->RegisterKeyedNamespace("vllm/m", 4096);
  const RemoteNamespace tokens = *c->RegisterNamespace(
      ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json"), "mini", 64);
  auto says = [](const absl::Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  std::vector<uint32_t> ids(64, 1);
  std::vector<uint8_t> page(4096, 7);
  says(c->Store(keyed, std::nullopt, ids, page).status(), "caller-keyed");
  says(c->Lookup(keyed, ids).status(), "caller-keyed");
  ChunkToStore no_key{std::nullopt, {}, page, std::nullopt};
  says(c->StoreChunks(keyed, std::span(&no_key, 1), Durability::kMemory, 0).status(), "no key");
  std::vector<uint8_t> chunk(tokens.chunk_bytes, 1);
  ChunkToStore with_key{std::nullopt, ids, chunk, ChunkKey{}};
  says(c->StoreChunks(tokens, std::span(&with_key, 1), Durability::kMemory, 0).status(),
       "gives a key");
  says(CallerKey(keyed, "").status(), "1 to 64");
  says(CallerKey(keyed, std::string(65, 'k')).status(), "65 bytes");
  says(CallerKey(tokens, "k").status(), "derives its keys from tokens");
  says(c->RegisterKeyedNamespace("vllm/m", 0).status(), "page_bytes is 0");
  says(c->RegisterKeyedNamespace("vllm/m", uint64_t{1} << 40).status(), "at most");
  // A wrong-sized page names both sizes.
  std::vector<uint8_t> small(100);
  ChunkToStore bad{std::nullopt, {}, small, *CallerKey(keyed, "k")};
  says(c->StoreChunks(keyed, std::span(&bad, 1), Durability::kMemory, 0).status(), "100");
}

}  // namespace
}  // namespace kvc::client
