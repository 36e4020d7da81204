// The HBM tier end to end on a GPU: kvcached with --hbm-bytes promotes stored chunks into
// device memory; this process maps the arena over CUDA IPC and copies them device-to-
// device into its DevicePages, byte-identical to what was stored; repeat fetches hit T0;
// a deleted chunk ends the prefix. Skipped, saying so, where there is no GPU.
#include <random>

#include "cachesvc/client.h"
#include "gtest/gtest.h"
#include "kernels/device_pages.h"
#include "kernels/hbm_arena.h"
#include "kernels/kv_dequant.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cuda {
namespace {

using cachesvc::CacheClient;
using cachesvc::DeviceRefs;
using cachesvc::RemoteNamespace;

TEST(HbmIpcTest, AHandleOfTheWrongSizeIsRefused) {
  absl::StatusOr<std::unique_ptr<MappedHbmArena>> m = MappedHbmArena::Open("short", 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
}

TEST(HbmIpcTest, ChunksPromotedToHbmReachDevicePagesByIpc) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the HBM tier cannot start here";
  testing::TempDir dir;
  testing::Daemon daemon(dir.File("data"), {"--hbm-bytes", std::to_string(64 << 20)});
  cachesvc::ClientOptions options;
  options.address = daemon.address();
  std::unique_ptr<CacheClient> client = *CacheClient::Connect(options);
  const std::string config = testing::ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  absl::StatusOr<RemoteNamespace> ns = client->RegisterNamespace(config, "mini", 64);
  ASSERT_TRUE(ns.ok()) << ns.status();
  std::mt19937_64 rng(testing::FreshSeed());
  constexpr int64_t kChunks = 6;
  std::vector<uint32_t> tokens(kChunks * ns->chunk_tokens);
  for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % 512);
  std::vector<uint8_t> payloads(kChunks * ns->chunk_bytes);
  for (uint8_t& b : payloads) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(client->Store(*ns, std::nullopt, tokens, payloads).ok());
  const std::vector<storage::ChunkKey> keys = client->Keys(*ns, tokens);

  absl::StatusOr<DeviceRefs> refs = client->FetchDeviceRefs(*ns, keys);
  ASSERT_TRUE(refs.ok()) << refs.status();
  ASSERT_EQ(refs->chunks.size(), static_cast<size_t>(kChunks));
  absl::StatusOr<std::unique_ptr<MappedHbmArena>> arena =
      MappedHbmArena::Open(refs->ipc_handle, refs->device);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const ModelConfig c = *LoadModelConfig(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  const ChunkLayout layout = *BuildChunkLayout(c, *BuildLayerSchedule(c), 64);
  ASSERT_EQ(static_cast<uint64_t>(layout.chunk_bytes), ns->chunk_bytes);
  absl::StatusOr<std::unique_ptr<DevicePages>> pages = DevicePages::Create(layout, kChunks + 2);
  ASSERT_TRUE(pages.ok()) << pages.status();
  std::vector<HbmChunk> chunks;
  for (const auto& ch : refs->chunks) chunks.push_back({ch.offset, ch.length});
  ASSERT_TRUE((*arena)->CopyToPages(chunks, **pages, 2).ok());
  ASSERT_TRUE((*pages)->Synchronize().ok());
  std::vector<uint8_t> back(payloads.size());
  ASSERT_TRUE((*pages)->Download(2, back).ok());
  EXPECT_EQ(back, payloads);
  ASSERT_TRUE(client->ReleaseDeviceRefs(refs->lease_id).ok());

  // Again: every chunk is a T0 hit now. Then a deleted chunk ends the prefix before it.
  const uint64_t hits = client->Stats()->hbm_hits();
  refs = client->FetchDeviceRefs(*ns, keys);
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ(client->Stats()->hbm_hits(), hits + kChunks);
  ASSERT_TRUE(client->ReleaseDeviceRefs(refs->lease_id).ok());
  ASSERT_TRUE(client->Delete(*ns, std::span(keys).subspan(3, 1)).ok());
  refs = client->FetchDeviceRefs(*ns, keys);
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ(refs->chunks.size(), 3u);
}

}  // namespace
}  // namespace kvc::cuda
