// kvcached end to end: the real daemon binary on loopback, real gRPC, real data folder.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "storage/ram_tier.h"
#include "storage/slot_format.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/http_get.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::testing::Daemon;
using ::kvc::testing::FreeLoopbackPort;
using ::kvc::testing::ReadFile;
using ::kvc::testing::TempDir;

struct Client {
  std::string token;
  std::unique_ptr<grpc::ClientContext> Ctx() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
};

const std::string& MiniConfig() {
  static const std::string text = ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  return text;
}

pb::RegisterNamespaceResponse Register(Daemon& d, const Client& c,
                                       const std::string& model = "mini-test") {
  pb::RegisterNamespaceRequest req;
  req.set_model_config_json(MiniConfig());
  req.set_model_id(model);
  req.set_chunk_tokens(64);
  pb::RegisterNamespaceResponse resp;
  grpc::Status s = d.stub().RegisterNamespace(c.Ctx().get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

struct Chunk {
  std::vector<uint32_t> tokens;
  std::string payload;
};

std::vector<Chunk> MakeChunks(std::mt19937_64& rng, int n, uint32_t chunk_tokens,
                              uint64_t chunk_bytes) {
  std::vector<Chunk> chunks(n);
  for (Chunk& c : chunks) {
    for (uint32_t i = 0; i < chunk_tokens; ++i)
      c.tokens.push_back(static_cast<uint32_t>(rng() % 512));
    c.payload.resize(chunk_bytes);
    for (char& b : c.payload) b = static_cast<char>(rng());
  }
  return chunks;
}

std::vector<uint32_t> AllTokens(const std::vector<Chunk>& chunks) {
  std::vector<uint32_t> t;
  for (const Chunk& c : chunks) t.insert(t.end(), c.tokens.begin(), c.tokens.end());
  return t;
}

pb::LookupResponse Lookup(Daemon& d, const Client& c, uint32_t ns,
                          const std::vector<uint32_t>& tokens, grpc::Status* status = nullptr) {
  pb::LookupRequest req;
  req.set_namespace_id(ns);
  for (uint32_t t : tokens) req.add_tokens(t);
  pb::LookupResponse resp;
  grpc::Status s = d.stub().Lookup(c.Ctx().get(), req, &resp);
  if (status)
    *status = s;
  else
    EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

// Stores a whole prefix: keys come from Lookup (the server's hashing; the public
// algorithm is checked separately against vectors), each chunk chained to the previous.
grpc::Status StorePrefix(Daemon& d, const Client& c, uint32_t ns, const std::vector<Chunk>& chunks,
                         pb::StoreResponse* resp,
                         pb::Durability durability = pb::DURABILITY_DURABLE) {
  const pb::LookupResponse keys = Lookup(d, c, ns, AllTokens(chunks));
  auto ctx = c.Ctx();
  auto writer = d.stub().Store(ctx.get(), resp);
  for (size_t i = 0; i < chunks.size(); ++i) {
    pb::StoreRequest req;
    req.set_namespace_id(ns);
    if (i > 0) req.set_parent_key(keys.chunk_keys(static_cast<int>(i) - 1));
    for (uint32_t t : chunks[i].tokens) req.add_tokens(t);
    req.set_payload(chunks[i].payload);
    req.set_durability(durability);
    if (!writer->Write(req)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

std::vector<pb::FetchResponse> Fetch(Daemon& d, const Client& c, uint32_t ns,
                                     const google::protobuf::RepeatedPtrField<std::string>& keys,
                                     grpc::Status* status) {
  pb::FetchRequest req;
  req.set_namespace_id(ns);
  *req.mutable_chunk_keys() = keys;
  auto ctx = c.Ctx();
  auto reader = d.stub().Fetch(ctx.get(), req);
  std::vector<pb::FetchResponse> out;
  pb::FetchResponse r;
  while (reader->Read(&r)) out.push_back(r);
  *status = reader->Finish();
  return out;
}

TEST(KvcachedTest, StoreLookupFetchSurviveRestartsAndCrashes) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"));
  Client c;
  const pb::RegisterNamespaceResponse ns = Register(d, c);
  ASSERT_GT(ns.namespace_id(), 0u);
  EXPECT_EQ(ns.root_key().size(), 16u);
  EXPECT_EQ(Register(d, c).namespace_id(), ns.namespace_id());  // idempotent
  EXPECT_NE(Register(d, c, "other-weights").namespace_id(), ns.namespace_id());

  const std::vector<Chunk> chunks = MakeChunks(rng, 4, ns.chunk_tokens(), ns.chunk_bytes());
  std::vector<uint32_t> tokens = AllTokens(chunks);
  tokens.push_back(7);  // a partial tail is not a chunk
  pb::LookupResponse before = Lookup(d, c, ns.namespace_id(), tokens);
  EXPECT_EQ(before.matched_chunks(), 0u);
  EXPECT_EQ(before.chunk_keys_size(), 4);

  pb::StoreResponse stored;
  grpc::Status s = StorePrefix(d, c, ns.namespace_id(), chunks, &stored);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(stored.stored(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(stored.chunk_keys(i), before.chunk_keys(i));

  auto check = [&](pb::Tier expect_tier) {
    pb::LookupResponse after = Lookup(d, c, ns.namespace_id(), tokens);
    ASSERT_EQ(after.matched_chunks(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(after.tiers(i), expect_tier) << i;
    grpc::Status fs;
    std::vector<pb::FetchResponse> got = Fetch(d, c, ns.namespace_id(), after.chunk_keys(), &fs);
    ASSERT_TRUE(fs.ok()) << fs.error_message();
    ASSERT_EQ(got.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i].chunk_key(), after.chunk_keys(i));
      EXPECT_TRUE(got[i].payload() == chunks[i].payload) << "chunk " << i << " differs";
    }
  };
  check(pb::TIER_RAM);
  EXPECT_EQ(Register(d, c).namespace_id(), ns.namespace_id());
  d.Restart(SIGTERM);  // "the next day": everything comes back from SSD
  EXPECT_EQ(Register(d, c).namespace_id(), ns.namespace_id());
  check(pb::TIER_SSD);
  d.Restart(SIGKILL);  // durable acks survive a crash too
  check(pb::TIER_SSD);
}

// Sends one Store message; returns the call's status.
grpc::Status StoreOne(Daemon& d, const Client& c, const pb::StoreRequest& req,
                      pb::StoreResponse* resp) {
  auto ctx = c.Ctx();
  auto writer = d.stub().Store(ctx.get(), resp);
  writer->Write(req);
  writer->WritesDone();
  return writer->Finish();
}

void ExpectStatus(const grpc::Status& s, grpc::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(text), std::string::npos)
      << "\"" << text << "\" not in: " << s.error_message();
}

// A durable stream longer than its batches: full batches are written in the background
// while the next messages are read (store_reactor.cc), yet the answer lists the chunks in
// the stream's order, a memory message waits for the durable ones before it (and so finds
// its parent), every durable ack survives a SIGKILL, and a bad message after several batches fails
// the call naming it with everything before it stored and nothing after.
TEST(KvcachedTest, ADurableStreamWrittenInBackgroundBatchesKeepsItsOrderAndItsAcks) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"), {"--durable-store-batch", "3", "--durable-store-in-flight", "2"});
  Client c;
  const pb::RegisterNamespaceResponse ns = Register(d, c);
  const int n = 14 + static_cast<int>(rng() % 8);
  const int memory_at = 7 + static_cast<int>(rng() % 5);  // after two full batches
  std::printf("%d chunks, message %d memory-durable\n", n, memory_at);
  // Stores chunks[0, end) as one stream; message `bad` (if any) one byte short.
  auto store = [&](const std::vector<Chunk>& chunks, int end, int memory, int bad,
                   pb::StoreResponse* resp) {
    const pb::LookupResponse keys = Lookup(d, c, ns.namespace_id(), AllTokens(chunks));
    auto ctx = c.Ctx();
    auto writer = d.stub().Store(ctx.get(), resp);
    for (int i = 0; i < end; ++i) {
      pb::StoreRequest req;
      req.set_namespace_id(ns.namespace_id());
      if (i > 0) req.set_parent_key(keys.chunk_keys(i - 1));
      for (uint32_t t : chunks[i].tokens) req.add_tokens(t);
      req.set_payload(chunks[i].payload);
      if (i == bad) req.mutable_payload()->pop_back();
      req.set_durability(i == memory ? pb::DURABILITY_MEMORY : pb::DURABILITY_DURABLE);
      if (!writer->Write(req)) break;
    }
    writer->WritesDone();
    return std::make_pair(writer->Finish(), keys);
  };

  const std::vector<Chunk> chunks = MakeChunks(rng, n, ns.chunk_tokens(), ns.chunk_bytes());
  pb::StoreResponse resp;
  auto [s, keys] = store(chunks, n, memory_at, -1, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.stored(), static_cast<uint32_t>(n));
  ASSERT_EQ(resp.chunk_keys_size(), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(resp.chunk_keys(i), keys.chunk_keys(i)) << i;
  EXPECT_EQ(Lookup(d, c, ns.namespace_id(), AllTokens(chunks)).matched_chunks(),
            static_cast<uint32_t>(n));

  // Every durable chunk was acknowledged durable; the memory one survives only if RAM
  // pressure happened to write it back.
  d.Restart(SIGKILL);
  EXPECT_GE(Lookup(d, c, ns.namespace_id(), AllTokens(chunks)).matched_chunks(),
            static_cast<uint32_t>(memory_at));
  google::protobuf::RepeatedPtrField<std::string> after(keys.chunk_keys().begin() + memory_at + 1,
                                                        keys.chunk_keys().end());
  grpc::Status fs;
  std::vector<pb::FetchResponse> got = Fetch(d, c, ns.namespace_id(), after, &fs);
  ASSERT_TRUE(fs.ok()) << fs.error_message();
  ASSERT_EQ(got.size(), static_cast<size_t>(n - memory_at - 1));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].payload() == chunks[memory_at + 1 + i].payload) << "chunk differs";
  }

  const std::vector<Chunk> other = MakeChunks(rng, n, ns.chunk_tokens(), ns.chunk_bytes());
  const int bad = 7 + static_cast<int>(rng() % (n - 8));
  std::printf("bad message %d of %d\n", bad, n);
  pb::StoreResponse bad_resp;
  auto [bs, other_keys] = store(other, n, -1, bad, &bad_resp);
  ExpectStatus(bs, grpc::StatusCode::INVALID_ARGUMENT,
               "message " + std::to_string(bad) + ": chunk payload is");
  EXPECT_EQ(Lookup(d, c, ns.namespace_id(), AllTokens(other)).matched_chunks(),
            static_cast<uint32_t>(bad));
  d.Restart(SIGKILL);
  EXPECT_EQ(Lookup(d, c, ns.namespace_id(), AllTokens(other)).matched_chunks(),
            static_cast<uint32_t>(bad));
}

// A fetch from SSD reads the chunks ahead in batches while it sends (fetch_reactor.cc):
// every byte still arrives in order, a chunk missing mid-batch ends the prefix exactly
// there, and a client that leaves mid-read does not take the daemon down.
TEST(KvcachedTest, AFetchFromSsdReadsAheadInOrderAndStopsAtAMissingChunk) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"));
  Client c;
  const pb::RegisterNamespaceResponse ns = Register(d, c);
  constexpr int kChunks = 70, kMissing = 45;  // several read-ahead batches
  const std::vector<Chunk> chunks = MakeChunks(rng, kChunks, ns.chunk_tokens(), ns.chunk_bytes());
  pb::StoreResponse stored;
  ASSERT_TRUE(StorePrefix(d, c, ns.namespace_id(), chunks, &stored).ok());
  ASSERT_EQ(stored.stored(), static_cast<uint32_t>(kChunks));
  d.Restart(SIGTERM);  // RAM is empty: every chunk comes from the slabs
  Register(d, c);
  const pb::LookupResponse keys = Lookup(d, c, ns.namespace_id(), AllTokens(chunks));
  ASSERT_EQ(keys.matched_chunks(), static_cast<uint32_t>(kChunks));
  for (int i = 0; i < kChunks; ++i) ASSERT_EQ(keys.tiers(i), pb::TIER_SSD);
  {
    pb::DeleteRequest del;
    del.set_namespace_id(ns.namespace_id());
    del.add_chunk_keys(keys.chunk_keys(kMissing));
    pb::DeleteResponse resp;
    ASSERT_TRUE(d.stub().Delete(c.Ctx().get(), del, &resp).ok());
  }
  for (int round = 0; round < 2; ++round) {  // from SSD, then (promoted) from RAM
    grpc::Status fs;
    std::vector<pb::FetchResponse> got = Fetch(d, c, ns.namespace_id(), keys.chunk_keys(), &fs);
    ExpectStatus(fs, grpc::StatusCode::NOT_FOUND, "chunk_keys[" + std::to_string(kMissing) + "]");
    ASSERT_EQ(got.size(), static_cast<size_t>(kMissing)) << "round " << round;
    for (int i = 0; i < kMissing; ++i) {
      ASSERT_EQ(got[i].chunk_key(), keys.chunk_keys(i)) << "round " << round << " chunk " << i;
      ASSERT_TRUE(got[i].payload() == chunks[i].payload) << "round " << round << " chunk " << i;
    }
  }
  // Clients that read one chunk and leave, while the next batch is being read.
  d.Restart(SIGTERM);
  Register(d, c);
  for (int i = 0; i < 20; ++i) {
    pb::FetchRequest req;
    req.set_namespace_id(ns.namespace_id());
    for (int k = 0; k < kMissing; ++k) req.add_chunk_keys(keys.chunk_keys(k));
    auto ctx = c.Ctx();
    auto reader = d.stub().Fetch(ctx.get(), req);
    pb::FetchResponse r;
    reader->Read(&r);
    ctx->TryCancel();
    (void)reader->Finish();
  }
  grpc::Status fs;
  std::vector<pb::FetchResponse> got = Fetch(d, c, ns.namespace_id(), keys.chunk_keys(), &fs);
  EXPECT_EQ(got.size(), static_cast<size_t>(kMissing)) << "the daemon after the cancelled fetches";
}

TEST(KvcachedTest, BadInputGetsAPreciseStatusAndStoresNothing) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"));
  Client c;
  const pb::RegisterNamespaceResponse ns = Register(d, c);
  const std::vector<Chunk> chunks = MakeChunks(rng, 1, ns.chunk_tokens(), ns.chunk_bytes());
  auto good = [&] {
    pb::StoreRequest req;
    req.set_namespace_id(ns.namespace_id());
    for (uint32_t t : chunks[0].tokens) req.add_tokens(t);
    req.set_payload(chunks[0].payload);
    return req;
  };
  pb::StoreResponse resp;
  pb::StoreRequest req = good();
  req.mutable_payload()->pop_back();
  ExpectStatus(StoreOne(d, c, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "chunk payload is " + std::to_string(ns.chunk_bytes() - 1) + " bytes");
  req = good();
  req.mutable_tokens()->RemoveLast();
  ExpectStatus(StoreOne(d, c, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "chunk has 63 tokens");
  req = good();
  req.set_tokens(5, 999999);
  ExpectStatus(StoreOne(d, c, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "tokens[5] is 999999");
  req = good();
  req.set_parent_key(std::string(16, 'x'));
  ExpectStatus(StoreOne(d, c, req, &resp), grpc::StatusCode::FAILED_PRECONDITION, "is not cached");
  req = good();
  req.set_parent_key("short");
  ExpectStatus(StoreOne(d, c, req, &resp), grpc::StatusCode::INVALID_ARGUMENT,
               "parent_key is 5 bytes");
  req = good();
  req.set_namespace_id(ns.namespace_id() + 100);
  ExpectStatus(StoreOne(d, c, req, &resp), grpc::StatusCode::NOT_FOUND, "namespace");
  // Nothing of the above was stored.
  EXPECT_EQ(Lookup(d, c, ns.namespace_id(), chunks[0].tokens).matched_chunks(), 0u);

  grpc::Status st;
  Lookup(d, c, ns.namespace_id(), {1, 2, 600}, &st);
  ExpectStatus(st, grpc::StatusCode::INVALID_ARGUMENT,
               "tokens[2] is 600, outside the vocabulary of 512");
  google::protobuf::RepeatedPtrField<std::string> bad_keys;
  *bad_keys.Add() = "0123456789abcde";
  Fetch(d, c, ns.namespace_id(), bad_keys, &st);
  ExpectStatus(st, grpc::StatusCode::INVALID_ARGUMENT, "chunk_keys[0] is 15 bytes");
  *bad_keys.Mutable(0) = std::string(16, 'k');
  Fetch(d, c, ns.namespace_id(), bad_keys, &st);
  ExpectStatus(st, grpc::StatusCode::NOT_FOUND, "chunk_keys[0]");

  pb::RegisterNamespaceRequest reg;
  reg.set_model_id("m");
  reg.set_model_config_json("{\"text_config\": {\"head_dim\": 64}}");
  pb::RegisterNamespaceResponse reg_resp;
  ExpectStatus(d.stub().RegisterNamespace(c.Ctx().get(), reg, &reg_resp),
               grpc::StatusCode::INVALID_ARGUMENT, "missing key");
  reg.set_model_config_json(MiniConfig());
  reg.set_chunk_tokens(63);
  ExpectStatus(d.stub().RegisterNamespace(c.Ctx().get(), reg, &reg_resp),
               grpc::StatusCode::INVALID_ARGUMENT, "chunk_tokens 63");
  reg.set_chunk_tokens(1 << 20);
  ExpectStatus(d.stub().RegisterNamespace(c.Ctx().get(), reg, &reg_resp),
               grpc::StatusCode::INVALID_ARGUMENT, "this server stores chunks of at most");
  // Too many tokens for one Lookup; and a message past the size limit, which gRPC itself
  // refuses before it reaches the service.
  std::vector<uint32_t> many(5u << 20, 1);
  Lookup(d, c, ns.namespace_id(), many, &st);
  ExpectStatus(st, grpc::StatusCode::INVALID_ARGUMENT, "tokens in one Lookup; the limit is");
  std::vector<uint32_t> huge(5u << 20, 1u << 31);  // 5-byte varints: 26 MB
  Lookup(d, c, ns.namespace_id(), huge, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
}

TEST(KvcachedTest, TenantsCannotSeeEachOthersChunks) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "# token tenant\nsecret-a acme\nsecret-b globex\n";
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens")});
  const Client a{"secret-a"}, b{"secret-b"}, nobody{""}, wrong{"secret-c"};
  pb::RegisterNamespaceRequest reg;
  reg.set_model_config_json(MiniConfig());
  reg.set_model_id("mini-test");
  pb::RegisterNamespaceResponse r;
  ExpectStatus(d.stub().RegisterNamespace(nobody.Ctx().get(), reg, &r),
               grpc::StatusCode::UNAUTHENTICATED, "missing");
  ExpectStatus(d.stub().RegisterNamespace(wrong.Ctx().get(), reg, &r),
               grpc::StatusCode::UNAUTHENTICATED, "unknown");

  const pb::RegisterNamespaceResponse na = Register(d, a), nb = Register(d, b);
  EXPECT_NE(na.namespace_id(), nb.namespace_id());
  EXPECT_NE(na.root_key(), nb.root_key());  // same model, another tenant: other keys
  const std::vector<Chunk> chunks = MakeChunks(rng, 2, na.chunk_tokens(), na.chunk_bytes());
  pb::StoreResponse stored;
  ASSERT_TRUE(StorePrefix(d, a, na.namespace_id(), chunks, &stored).ok());

  // b cannot use a's namespace, and cannot tell it exists.
  grpc::Status st;
  Lookup(d, b, na.namespace_id(), AllTokens(chunks), &st);
  ExpectStatus(st, grpc::StatusCode::NOT_FOUND,
               "namespace " + std::to_string(na.namespace_id()) + " not found");
  Lookup(d, b, 9999, AllTokens(chunks), &st);
  ExpectStatus(st, grpc::StatusCode::NOT_FOUND, "namespace 9999 not found");
  // b's own namespace does not see a's chunks, even by a's keys.
  EXPECT_EQ(Lookup(d, b, nb.namespace_id(), AllTokens(chunks)).matched_chunks(), 0u);
  Fetch(d, b, nb.namespace_id(), stored.chunk_keys(), &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  // a still sees them.
  EXPECT_EQ(Lookup(d, a, na.namespace_id(), AllTokens(chunks)).matched_chunks(), 2u);
}

// --tenant-quota: a tenant past its quota evicts its own chunks and nobody else's; pins
// past its pin limit are refused naming it and the limit (a Store refused when all a
// tenant holds is pinned: QuotaTest in tests/storage).
// What a chunk of the mini model is charged against quotas in each tier (in RAM its pages,
// on SSD the slot of its size class), and what the daemon reports for a typical chunk (its
// first class's slot), read from a daemon of the tests' geometry started on `dir` with a
// quota for its one tenant.
struct SlotCharge {
  uint64_t chunk_bytes = 0, ram = 0, ssd = 0, ssd_typical = 0;
};
SlotCharge ChargePerChunk(const std::string& dir) {
  Daemon probe(dir, {"--tenant-quota", "default:ssd=1M"});
  SlotCharge c;
  c.chunk_bytes = Register(probe, Client{}).chunk_bytes();
  pb::StatsResponse s;
  EXPECT_TRUE(probe.stub().Stats(Client{}.Ctx().get(), {}, &s).ok());
  c.ram = s.quota().ram_bytes_per_chunk();
  c.ssd = storage::SlotBytesFor(c.chunk_bytes);
  c.ssd_typical = s.quota().ssd_bytes_per_chunk();
  EXPECT_GT(c.ram, c.chunk_bytes);
  EXPECT_GT(c.ssd, c.chunk_bytes);
  EXPECT_GE(c.ssd_typical, c.ssd);
  return c;
}

// The hostile tenant of the isolation review: small chunks under a byte quota held nearly
// every slot of the tier and evicted another tenant's chunks that were within its own
// quota. Chunks are charged their slots, and tier pressure spares a tenant within its
// quota: globex keeps all it stored however much acme writes.
TEST(KvcachedTest, SmallChunksCannotCrowdOutATenantWithinItsQuota) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "secret-a acme\nsecret-b globex\nsecret-c initech\n";
  const SlotCharge charge = ChargePerChunk(dir.File("probe"));
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--tenant-quota",
                              "acme:ssd=" + std::to_string(12 * charge.ssd), "--tenant-quota",
                              "globex:ssd=" + std::to_string(30 * charge.ssd)});
  const Client a{"secret-a"}, b{"secret-b"}, c{"secret-c"};
  const pb::RegisterNamespaceResponse na = Register(d, a), nb = Register(d, b), nc = Register(d, c);
  auto store_prefixes = [&](const Client& who, uint32_t ns, int n) {
    std::vector<std::vector<Chunk>> prefixes;
    for (int i = 0; i < n; ++i) {
      prefixes.push_back(MakeChunks(rng, 1, na.chunk_tokens(), na.chunk_bytes()));
      pb::StoreResponse stored;
      grpc::Status st = StorePrefix(d, who, ns, prefixes.back(), &stored);
      EXPECT_TRUE(st.ok()) << i << ": " << st.error_message();
    }
    return prefixes;
  };
  pb::StatsResponse tier;
  ASSERT_TRUE(d.stub().Stats(b.Ctx().get(), {}, &tier).ok());
  const auto globex = store_prefixes(b, nb.namespace_id(), 30);
  // acme (over its quota) and initech (no quota) write several times what the tier holds.
  store_prefixes(a, na.namespace_id(), 150);
  store_prefixes(c, nc.namespace_id(), 300);
  int globex_kept = 0;
  for (const auto& p : globex) {
    globex_kept += Lookup(d, b, nb.namespace_id(), AllTokens(p)).matched_chunks();
  }
  EXPECT_EQ(globex_kept, 30) << "tier pressure evicted a tenant within its quota";
  pb::StatsResponse sa;
  ASSERT_TRUE(d.stub().Stats(a.Ctx().get(), {}, &sa).ok());
  EXPECT_LE(sa.quota().ssd_bytes(), 12 * charge.ssd);
  EXPECT_LE(sa.ssd_chunks(), 12u) << "acme's small chunks held past its quota's slots";
}

// One daemon per address: a second kvcached given the port of a running one exits naming
// the address (gRPC's default SO_REUSEPORT let it start, and the kernel then split new
// connections between two caches holding different chunks).
TEST(KvcachedTest, ASecondDaemonOnAPortInUseRefusesToStart) {
  TempDir dir;
  Daemon first(dir.File("first"));
  // Under timeout(1): a second daemon that does start is stopped (exit 124) and fails this.
  testing::ProcessResult r = testing::RunProgram(
      "/usr/bin/timeout", {"60", testing::kDaemon, "--data-dir", dir.File("second"), "--ram-bytes",
                           "4000000", "--ssd-bytes", "40000000", "--listen", first.address()});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("cannot listen on " + first.address()), std::string::npos) << r.err;
  pb::StatsResponse st;
  grpc::ClientContext ctx;
  EXPECT_TRUE(first.stub().Stats(&ctx, {}, &st).ok()) << "the first daemon still serves";
}

// Quotas are guaranteed shares: named quotas that together exceed a tier stop the daemon
// at start; a '*' tenant is admitted at its first namespace only while its quota fits.
TEST(KvcachedTest, QuotasThatDoNotFitTheTiersAreRefused) {
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "secret-a acme\nsecret-b globex\n";
  // The tests' daemons have 40,000,000 bytes of SSD.
  testing::ProcessResult r = testing::RunProgram(
      testing::kDaemon,
      {"--data-dir", dir.File("over"), "--ram-bytes", "4000000", "--ssd-bytes", "40000000",
       "--listen", "127.0.0.1:0", "--auth-tokens", dir.File("tokens"), "--tenant-quota",
       "acme:ssd=25000000", "--tenant-quota", "globex:ssd=25000000"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the named tenants' SSD quotas add up to 50000000 bytes"), std::string::npos)
      << r.err;
  Daemon d(dir.File("data"),
           {"--auth-tokens", dir.File("tokens"), "--tenant-quota", "*:ssd=25000000"});
  const Client a{"secret-a"}, b{"secret-b"};
  Register(d, a);
  pb::RegisterNamespaceRequest req;
  req.set_model_config_json(MiniConfig());
  req.set_model_id("mini-test");
  req.set_chunk_tokens(64);
  pb::RegisterNamespaceResponse resp;
  const grpc::Status refused = d.stub().RegisterNamespace(b.Ctx().get(), req, &resp);
  ExpectStatus(refused, grpc::StatusCode::RESOURCE_EXHAUSTED,
               "the quota of tenant globex does not fit");
  // It names globex's own quota only: not what the others were granted, nor the tier's room.
  EXPECT_EQ(refused.error_message().find_first_of("0123456789"), std::string::npos)
      << refused.error_message();
  // Refused, it left nothing behind: its namespace does not exist.
  pb::LookupRequest look;
  look.set_namespace_id(1 + Register(d, a).namespace_id());
  pb::LookupResponse lr;
  ExpectStatus(d.stub().Lookup(b.Ctx().get(), look, &lr), grpc::StatusCode::NOT_FOUND, "");
}

TEST(KvcachedTest, ATenantOverItsQuotaEvictsOnlyItsOwnChunks) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "secret-a acme\nsecret-b globex\n";
  const Client a{"secret-a"}, b{"secret-b"};
  // The quota is 4 chunks of the mini model in RAM and on SSD: in RAM 4 × its pages, on
  // SSD 4 slots (a chunk is charged what it takes). The sizes come from a first start.
  const SlotCharge charge = ChargePerChunk(dir.File("probe"));
  const uint64_t chunk_bytes = charge.chunk_bytes;
  const uint64_t ram_charge = storage::RamSlotBytes(chunk_bytes);
  Daemon d(dir.File("data"), {"--auth-tokens", dir.File("tokens"), "--tenant-quota",
                              "acme:ram=" + std::to_string(4 * ram_charge) +
                                  ",ssd=" + std::to_string(4 * charge.ssd) + ",pins=3"});
  const pb::RegisterNamespaceResponse na = Register(d, a), nb = Register(d, b);
  ASSERT_EQ(na.chunk_bytes(), chunk_bytes);
  // globex stores 6 prefixes of one chunk, acme 10.
  auto store_prefixes = [&](const Client& c, uint32_t ns, int n) {
    std::vector<std::vector<Chunk>> prefixes;
    for (int i = 0; i < n; ++i) {
      prefixes.push_back(MakeChunks(rng, 1, na.chunk_tokens(), chunk_bytes));
      pb::StoreResponse stored;
      grpc::Status st = StorePrefix(d, c, ns, prefixes.back(), &stored);
      EXPECT_TRUE(st.ok()) << i << ": " << st.error_message();
    }
    return prefixes;
  };
  const auto globex = store_prefixes(b, nb.namespace_id(), 6);
  const auto acme = store_prefixes(a, na.namespace_id(), 10);
  for (const auto& p : globex) {
    EXPECT_EQ(Lookup(d, b, nb.namespace_id(), AllTokens(p)).matched_chunks(), 1u);
  }
  int acme_kept = 0;
  for (const auto& p : acme) {
    acme_kept += Lookup(d, a, na.namespace_id(), AllTokens(p)).matched_chunks();
  }
  EXPECT_LE(acme_kept, 4);
  EXPECT_GE(acme_kept, 3);
  EXPECT_EQ(Lookup(d, a, na.namespace_id(), AllTokens(acme.back())).matched_chunks(), 1u);
  EXPECT_EQ(Lookup(d, a, na.namespace_id(), AllTokens(acme.front())).matched_chunks(), 0u);
  // Stats shows each tenant its own quota and what it holds against it.
  pb::StatsResponse sa, sb;
  ASSERT_TRUE(d.stub().Stats(a.Ctx().get(), {}, &sa).ok());
  ASSERT_TRUE(sa.has_quota());
  EXPECT_EQ(sa.quota().ssd_bytes_limit(), 4 * charge.ssd);
  EXPECT_EQ(sa.quota().ssd_bytes(), static_cast<uint64_t>(acme_kept) * charge.ssd);
  EXPECT_LE(sa.quota().ram_bytes(), 4 * ram_charge);
  EXPECT_EQ(sa.quota().ram_bytes() % ram_charge, 0u);
  EXPECT_EQ(sa.quota().ssd_bytes_per_chunk(), charge.ssd_typical);
  EXPECT_EQ(sa.quota().ram_bytes_per_chunk(), charge.ram);
  EXPECT_EQ(sa.quota().pinned_chunks_limit(), 3u);
  ASSERT_TRUE(d.stub().Stats(b.Ctx().get(), {}, &sb).ok());
  // globex has no quota of bytes, only the pin limit every tenant has (--default-pin-limit).
  ASSERT_TRUE(sb.has_quota());
  EXPECT_EQ(sb.quota().ssd_bytes_limit(), 0u);
  EXPECT_EQ(sb.quota().ram_bytes_limit(), 0u);
  EXPECT_EQ(sb.quota().pinned_chunks_limit(), 4096u);

  // Pins: 3 at most.
  pb::PinRequest pin;
  pin.set_namespace_id(na.namespace_id());
  pin.set_ttl_seconds(3600);
  for (size_t i = acme.size() - 3; i < acme.size(); ++i) {
    *pin.add_chunk_keys() = Lookup(d, a, na.namespace_id(), AllTokens(acme[i])).chunk_keys(0);
  }
  pb::PinResponse pinned;
  ASSERT_TRUE(d.stub().Pin(a.Ctx().get(), pin, &pinned).ok());
  EXPECT_EQ(pinned.pinned(), 3u);
  const std::vector<Chunk> more = MakeChunks(rng, 1, na.chunk_tokens(), chunk_bytes);
  pb::StoreResponse stored;
  ASSERT_TRUE(StorePrefix(d, a, na.namespace_id(), more, &stored).ok());
  pin.clear_chunk_keys();
  *pin.add_chunk_keys() = stored.chunk_keys(0);
  ExpectStatus(d.stub().Pin(a.Ctx().get(), pin, &pinned), grpc::StatusCode::RESOURCE_EXHAUSTED,
               "tenant acme may pin 3");
  ASSERT_TRUE(d.stub().Stats(a.Ctx().get(), {}, &sa).ok());
  EXPECT_EQ(sa.quota().pinned_chunks(), 3u);
}

// One tenant with too many calls in flight is refused; the others are not. Every call is
// in the structured log (JSON lines on stderr) by tenant, never by token.
TEST(KvcachedTest, TenantCallLimitAndStructuredLog) {
  TempDir dir;
  std::ofstream(dir.File("tokens")) << "secret-a acme\nsecret-b globex\n";
  const std::string log = dir.File("kvcached.log");
  Daemon d(
      dir.File("data"),
      {"--auth-tokens", dir.File("tokens"), "--max-calls-per-tenant", "2", "--log-level", "debug"},
      log);
  const Client a{"secret-a"}, b{"secret-b"};
  pb::StatsResponse stats;
  ASSERT_TRUE(d.stub().Stats(a.Ctx().get(), {}, &stats).ok());
  // Two Store streams that send nothing hold both of acme's slots.
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::StoreRequest>>> open;
  pb::StoreResponse ignored[2];
  for (int i = 0; i < 2; ++i) {
    ctxs.push_back(a.Ctx());
    open.push_back(d.stub().Store(ctxs.back().get(), &ignored[i]));
  }
  // Let both streams reach the server before taking a third slot (a poll that came
  // first would make the second stream the refused call).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  grpc::Status refused;
  int served_before = 0;  // calls that came before the streams reached the server
  for (int tries = 0; tries < 500; ++tries) {
    refused = d.stub().Stats(a.Ctx().get(), {}, &stats);
    if (!refused.ok()) break;
    ++served_before;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ExpectStatus(refused, grpc::StatusCode::RESOURCE_EXHAUSTED,
               "tenant \"acme\" has 2 calls in flight; the limit is 2");
  EXPECT_TRUE(d.stub().Stats(b.Ctx().get(), {}, &stats).ok()) << "another tenant is served";
  for (auto& w : open) {
    w->WritesDone();
    const grpc::Status fin = w->Finish();
    EXPECT_TRUE(fin.ok()) << fin.error_code() << " " << fin.error_message();
  }
  EXPECT_TRUE(d.stub().Stats(a.Ctx().get(), {}, &stats).ok()) << "slots come back";
  open.clear();
  ctxs.clear();
  d.Stop(SIGTERM);

  const std::string text = ReadFile(log);
  EXPECT_EQ(text.find("secret-"), std::string::npos) << "a bearer token reached the log";
  std::istringstream lines(text);
  std::map<std::string, int> seen;
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "not one JSON object per line: " << line;
    ASSERT_TRUE(j.contains("ts") && j.contains("level") && j.contains("event")) << line;
    if (j["event"] != "call") {
      ++seen[j["event"].get<std::string>()];
      continue;
    }
    ++seen[j["method"].get<std::string>() + " " + j["tenant"].get<std::string>() + " " +
           j["code"].get<std::string>()];
  }
  EXPECT_EQ(seen["start"], 1);
  EXPECT_EQ(seen["stopped"], 1);
  EXPECT_EQ(seen["Stats acme RESOURCE_EXHAUSTED"], 1);
  EXPECT_EQ(seen["Stats acme OK"], 2 + served_before);
  EXPECT_EQ(seen["Stats globex OK"], 1);
  EXPECT_EQ(seen["Store acme OK"], 2);
}

TEST(KvcachedTest, PinUnpinAndDelete) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"));
  Client c;
  const pb::RegisterNamespaceResponse ns = Register(d, c);
  const std::vector<Chunk> chunks = MakeChunks(rng, 3, ns.chunk_tokens(), ns.chunk_bytes());
  pb::StoreResponse stored;
  ASSERT_TRUE(StorePrefix(d, c, ns.namespace_id(), chunks, &stored, pb::DURABILITY_MEMORY).ok());
  EXPECT_EQ(stored.stored(), 3u);
  pb::StoreResponse again;
  ASSERT_TRUE(StorePrefix(d, c, ns.namespace_id(), chunks, &again).ok());
  EXPECT_EQ(again.already_present(), 3u);

  pb::PinRequest pin;
  pin.set_namespace_id(ns.namespace_id());
  *pin.mutable_chunk_keys() = stored.chunk_keys();
  pin.set_ttl_seconds(3600);
  pb::PinResponse pinned;
  ASSERT_TRUE(d.stub().Pin(c.Ctx().get(), pin, &pinned).ok());
  EXPECT_EQ(pinned.pinned(), 3u);
  pin.set_ttl_seconds(0);
  ExpectStatus(d.stub().Pin(c.Ctx().get(), pin, &pinned), grpc::StatusCode::INVALID_ARGUMENT,
               "ttl_seconds");
  pb::UnpinRequest unpin;
  unpin.set_namespace_id(ns.namespace_id());
  *unpin.mutable_chunk_keys() = stored.chunk_keys();
  pb::UnpinResponse unpinned;
  ASSERT_TRUE(d.stub().Unpin(c.Ctx().get(), unpin, &unpinned).ok());
  EXPECT_EQ(unpinned.unpinned(), 3u);

  pb::DeleteRequest del;
  del.set_namespace_id(ns.namespace_id());
  *del.add_chunk_keys() = stored.chunk_keys(2);
  pb::DeleteResponse deleted;
  ASSERT_TRUE(d.stub().Delete(c.Ctx().get(), del, &deleted).ok());
  EXPECT_EQ(deleted.deleted(), 1u);
  EXPECT_EQ(Lookup(d, c, ns.namespace_id(), AllTokens(chunks)).matched_chunks(), 2u);

  pb::StatsResponse stats;
  ASSERT_TRUE(d.stub().Stats(c.Ctx().get(), pb::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.ssd_chunks(), 2u);
  EXPECT_FALSE(stats.io_backend().empty());
}

using ::kvc::testing::HttpGet;

TEST(KvcachedTest, ServesPrometheusMetrics) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  const int port = FreeLoopbackPort();
  Daemon d(dir.File("data"), {"--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  Client c;
  const pb::RegisterNamespaceResponse ns = Register(d, c);
  const std::vector<Chunk> chunks = MakeChunks(rng, 2, ns.chunk_tokens(), ns.chunk_bytes());
  pb::StoreResponse stored;
  ASSERT_TRUE(StorePrefix(d, c, ns.namespace_id(), chunks, &stored).ok());
  grpc::Status st;
  Fetch(d, c, ns.namespace_id(), stored.chunk_keys(), &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  Lookup(d, c, 4242, {1}, &st);  // a NOT_FOUND call
  // A prefix of 3 chunks whose first 2 are stored (in RAM): tokens by the tier serving them.
  std::vector<uint32_t> three = AllTokens(chunks);
  for (uint32_t t = 0; t < ns.chunk_tokens(); ++t) three.push_back(t % 512);
  ASSERT_EQ(Lookup(d, c, ns.namespace_id(), three).matched_chunks(), 2u);
  const std::string text = HttpGet(port, "/metrics");
  for (const std::string& want : std::vector<std::string>{
           "kvcache_chunks{tier=\"ssd\"} 2", "kvcache_hits_total{tier=\"ram\"} 2",
           "kvcache_bytes_total{direction=\"in\"} " + std::to_string(2 * ns.chunk_bytes()),
           "kvcache_bytes_total{direction=\"out\"} " + std::to_string(2 * ns.chunk_bytes()),
           "kvcache_rpc_seconds_count{code=\"0\",method=\"Store\"} 1",
           "kvcache_rpc_seconds_count{code=\"5\",method=\"Lookup\"} 1",
           "kvcache_checksum_failures_total 0", "kvcache_index_rebuilds_total 0",
           absl::StrCat("kvcache_lookup_tokens_total{namespace=\"", ns.namespace_id(),
                        "\",tenant=\"default\",tier=\"ram\"} ", 2 * ns.chunk_tokens()),
           // StorePrefix's Lookup found none of its 2 chunks; this one misses its third.
           absl::StrCat("kvcache_lookup_tokens_total{namespace=\"", ns.namespace_id(),
                        "\",tenant=\"default\",tier=\"none\"} ", 3 * ns.chunk_tokens())}) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing \"" << want << "\" in:\n"
                                                  << text.substr(0, 3000);
  }
}

TEST(KvcachedTest, AnswersTheStandardHealthCheck) {
  TempDir dir;
  Daemon d(dir.File("data"));
  // grpc.health.v1.Health/Check with an empty HealthCheckRequest; the answer
  // HealthCheckResponse{status: SERVING} is the two bytes 08 01.
  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard lk(mu);
                   status = s;
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done; });
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

// grpc.reflection.v1alpha.ServerReflection, as grpcurl / grpc_cli / evans ask it: one
// request on the bidi stream, one response. Messages by hand (field numbers of
// reflection.proto): the request's list_services (7) or file_containing_symbol (4); the
// response's list_services_response (6: repeated service (1) { name (1) }) or
// file_descriptor_response (4: repeated bytes file_descriptor_proto (1)).
std::string AskReflection(const std::string& address, const std::string& request) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&](auto&& start) {
    start(reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  std::string bytes;
  if (step([&](void* t) { call->StartCall(t); }) && step([&](void* t) { call->Write(req, t); }) &&
      step([&](void* t) { call->WritesDone(t); }) && step([&](void* t) { call->Read(&resp, t); })) {
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(resp.Dump(&slices).ok());
    for (const auto& sl : slices)
      bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  grpc::Status status;
  step([&](void* t) { call->Finish(&status, t); });
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return bytes;
}

// The length-delimited fields numbered `field` of a message's bytes.
std::vector<std::string> Fields(const std::string& message, int field) {
  google::protobuf::UnknownFieldSet set;
  EXPECT_TRUE(set.ParseFromString(message));
  std::vector<std::string> out;
  for (int i = 0; i < set.field_count(); ++i) {
    if (set.field(i).number() == field &&
        set.field(i).type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED)
      out.push_back(set.field(i).length_delimited());
  }
  return out;
}

TEST(KvcachedTest, GenericToolsCanListAndDescribeItsMethodsByReflection) {
  TempDir dir;
  Daemon d(dir.File("data"));
  const std::string listed = AskReflection(d.address(), std::string("\x3a\x01*", 3));
  std::set<std::string> names;
  for (const std::string& list : Fields(listed, 6)) {
    for (const std::string& service : Fields(list, 1)) {
      for (const std::string& name : Fields(service, 1)) names.insert(name);
    }
  }
  EXPECT_TRUE(names.contains("kvcache.v1.KVCache")) << listed.size() << " bytes";
  EXPECT_TRUE(names.contains("grpc.health.v1.Health"));
  const std::string symbol = "kvcache.v1.KVCache";
  std::string ask = "\x22";
  ask.push_back(static_cast<char>(symbol.size()));
  ask += symbol;
  const std::string described = AskReflection(d.address(), ask);
  const std::vector<std::string> files = Fields(described, 4);
  ASSERT_EQ(files.size(), 1u) << described.size() << " bytes";
  bool found = false;
  for (const std::string& bytes : Fields(files[0], 1)) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    for (const auto& service : file.service()) {
      if (service.name() != "KVCache") continue;
      found = true;
      std::set<std::string> methods;
      for (const auto& m : service.method()) methods.insert(m.name());
      for (const char* m : {"Lookup", "Fetch", "Store", "RegisterNamespace"})
        EXPECT_TRUE(methods.contains(m)) << m;
    }
  }
  EXPECT_TRUE(found) << "no file describes the KVCache service";
}

TEST(KvcachedTest, AClientThatStopsReadingIsCutOffAtItsDeadline) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  Daemon d(dir.File("data"));
  Client c;
  // Reference-size chunks, more of them than the stream windows hold.
  pb::RegisterNamespaceRequest reg;
  reg.set_model_config_json(
      ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.config.json"));
  reg.set_model_id("ref");
  pb::RegisterNamespaceResponse ns;
  ASSERT_TRUE(d.stub().RegisterNamespace(c.Ctx().get(), reg, &ns).ok());
  std::vector<Chunk> chunks(60);
  for (Chunk& ch : chunks) {
    for (uint32_t i = 0; i < ns.chunk_tokens(); ++i)
      ch.tokens.push_back(static_cast<uint32_t>(rng() % 129280));
    ch.payload.assign(ns.chunk_bytes(), static_cast<char>(rng()));
  }
  pb::StoreResponse stored;
  ASSERT_TRUE(StorePrefix(d, c, ns.namespace_id(), chunks, &stored).ok());
  ASSERT_EQ(stored.stored(), 60u);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
    pb::FetchRequest req;
    req.set_namespace_id(ns.namespace_id());
    *req.mutable_chunk_keys() = stored.chunk_keys();
    auto reader = d.stub().Fetch(&ctx, req);
    pb::FetchResponse one;
    ASSERT_TRUE(reader->Read(&one));  // then stop reading
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // The server is not stuck: other calls work, and it drains and stops promptly.
  grpc::Status st;
  std::vector<pb::FetchResponse> got = Fetch(d, c, ns.namespace_id(), stored.chunk_keys(), &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got.size(), 60u);
  // Only the abandoned call may hold the stop up (to the daemon's 10 s shutdown deadline),
  // not this idle connection's answer to the GOAWAY (see Disconnect).
  d.Disconnect();
  const auto t0 = std::chrono::steady_clock::now();
  const int status = d.Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
}

TEST(KvcachedTest, ServesTls) {
  TempDir dir;
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
      "-addext subjectAltName=IP:127.0.0.1 -keyout " +
      dir.File("key.pem") + " -out " + dir.File("cert.pem") + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  Daemon d(dir.File("data"),
           {"--tls-cert", dir.File("cert.pem"), "--tls-key", dir.File("key.pem")});
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(dir.File("cert.pem"));
  auto secure = pb::KVCache::NewStub(grpc::CreateChannel(d.address(), grpc::SslCredentials(ssl)));
  Client c;
  pb::StatsResponse stats;
  grpc::Status s = secure->Stats(c.Ctx().get(), pb::StatsRequest(), &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  // Plaintext is refused by a TLS server.
  s = d.stub().Stats(c.Ctx().get(), pb::StatsRequest(), &stats);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace kvc
