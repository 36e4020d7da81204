// A serving engine's pages as they come, on a kvcached with its default chunk limit: from a
// 4 KiB page to SGLang's DeepSeek-V3 MLA host page (61 layers × 64 tokens × 576 × bf16 =
// 4,497,408 bytes), each stored durably in a caller-keyed namespace, survives a SIGKILL,
// fetches byte-exact, and is charged its own size class's slot — header and payload in
// 4 KiB pages — which Stats reports (docs/storage.md, "Size classes").
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "storage/slot_format.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cachesvc {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::testing::Daemon;
using ::kvc::testing::TempDir;

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return ctx;
}

TEST(PageSizesTest, PagesFromFourKibToAnMlaHostPageAreKeptByteExactAndChargedTheirOwnSlot) {
  std::mt19937_64 rng(testing::FreshSeed());
  TempDir dir;
  // The fixture's small tiers (4 MB of RAM, 40 MB of SSD), kvcached's default chunk limit.
  Daemon d(dir.File("data"));
  const std::vector<uint64_t> sizes = {4096, 16384, 57344, 227840, 1048576, 4497408};
  constexpr int kPages = 2;
  struct Stored {
    uint32_t ns;
    std::vector<std::string> keys, payloads;
  };
  std::vector<Stored> stored;
  uint64_t payload = 0, slots = 0;
  for (uint64_t size : sizes) {
    pb::RegisterNamespaceRequest reg;
    reg.set_model_id("pages-" + std::to_string(size));
    reg.set_key_mode(pb::KEY_MODE_CALLER);
    reg.set_page_bytes(size);
    reg.set_chunk_tokens(64);
    pb::RegisterNamespaceResponse ns;
    const grpc::Status registered = d.stub().RegisterNamespace(Ctx().get(), reg, &ns);
    ASSERT_TRUE(registered.ok()) << size << ": " << registered.error_message();
    Stored s{ns.namespace_id(), {}, {}};
    auto ctx = Ctx();
    pb::StoreResponse resp;
    auto writer = d.stub().Store(ctx.get(), &resp);
    for (int p = 0; p < kPages; ++p) {
      std::string key(16, '\0'), bytes(size, '\0');
      for (char& c : key) c = static_cast<char>(rng());
      for (char& c : bytes) c = static_cast<char>(rng());
      pb::StoreRequest req;
      req.set_namespace_id(s.ns);
      req.set_chunk_key(key);
      req.set_payload(bytes);
      req.set_durability(pb::DURABILITY_DURABLE);
      ASSERT_TRUE(writer->Write(req)) << size;
      s.keys.push_back(key);
      s.payloads.push_back(std::move(bytes));
    }
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    ASSERT_TRUE(st.ok()) << size << ": " << st.error_message();
    EXPECT_EQ(resp.stored(), static_cast<uint32_t>(kPages)) << size;
    stored.push_back(std::move(s));
    payload += kPages * size;
    slots += kPages * storage::SlotBytesFor(size);
  }
  d.Restart(SIGKILL);  // durable pages survive a crash
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // a 4.5 MB page is over gRPC's 4 MB default
  auto stub = pb::KVCache::NewStub(
      grpc::CreateCustomChannel(d.address(), grpc::InsecureChannelCredentials(), args));
  for (size_t i = 0; i < sizes.size(); ++i) {
    pb::FetchRequest req;
    req.set_namespace_id(stored[i].ns);
    for (const std::string& key : stored[i].keys) req.add_chunk_keys(key);
    auto ctx = Ctx();
    auto reader = stub->Fetch(ctx.get(), req);
    pb::FetchResponse page;
    int got = 0;
    while (reader->Read(&page)) {
      ASSERT_LT(got, kPages);
      EXPECT_EQ(page.chunk_key(), stored[i].keys[static_cast<size_t>(got)]);
      EXPECT_TRUE(page.payload() == stored[i].payloads[static_cast<size_t>(got)])
          << sizes[i] << ": page " << got << " differs";
      ++got;
    }
    const grpc::Status st = reader->Finish();
    EXPECT_TRUE(st.ok()) << sizes[i] << ": " << st.error_message();
    EXPECT_EQ(got, kPages) << sizes[i];
  }
  pb::StatsResponse stats;
  ASSERT_TRUE(stub->Stats(Ctx().get(), {}, &stats).ok());
  EXPECT_EQ(stats.ssd_bytes(), slots) << "each page charged its own class's slot";
  EXPECT_GT(stats.ssd_capacity_bytes(), 0u);
  std::map<uint64_t, uint64_t> chunks_of;
  for (const pb::SsdSizeClass& c : stats.ssd_classes()) chunks_of[c.slot_bytes()] = c.chunks();
  for (uint64_t size : sizes) {
    EXPECT_EQ(chunks_of[storage::SlotBytesFor(size)], static_cast<uint64_t>(kPages)) << size;
    std::printf("%8llu-byte pages: %.4f SSD bytes charged per payload byte\n",
                static_cast<unsigned long long>(size),
                static_cast<double>(storage::SlotBytesFor(size)) / static_cast<double>(size));
  }
  std::printf("all: %llu payload bytes charged %llu (%.4f)\n",
              static_cast<unsigned long long>(payload), static_cast<unsigned long long>(slots),
              static_cast<double>(slots) / static_cast<double>(payload));
}

}  // namespace
}  // namespace kvc::cachesvc
