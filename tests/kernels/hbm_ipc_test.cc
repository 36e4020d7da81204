// The HBM tier end to end on a GPU: kvcached with --hbm-bytes promotes stored chunks into
// device memory; this process maps the arena over CUDA IPC and copies them device-to-
// device into its DevicePages, byte-identical to what was stored; repeat fetches hit T0;
// a deleted chunk ends the prefix; an engine resuming from chunks in HBM reads them out
// over CUDA IPC and gets the logits of the same resume from RAM, and a device copy changed
// through another mapping is caught by its checksum and fetched instead. Skipped, saying
// so, where there is no GPU.
#include <cuda_runtime_api.h>

#include <random>

#include "backends/select.h"
#include "client/client.h"
#include "client/stats.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "kernels/device_pages.h"
#include "kernels/hbm_arena.h"
#include "kernels/kv_dequant.h"
#include "serve/cache_connector.h"
#include "tests/cachesvc/daemon.h"
#include "tests/testing/same_bits.h"
#include "tests/testing/seed.h"
#include "tests/testing/subprocess.h"

namespace kvc::cuda {
namespace {

using client::CacheClient;
using client::DeviceRefs;
using client::RemoteNamespace;

TEST(HbmIpcTest, AHandleOfTheWrongSizeIsRefused) {
  absl::StatusOr<std::unique_ptr<MappedHbmArena>> m = MappedHbmArena::Open("short", 0);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
}

TEST(HbmIpcTest, ChunksPromotedToHbmReachDevicePagesByIpc) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the HBM tier cannot start here";
  testing::TempDir dir;
  testing::Daemon daemon(dir.File("data"), {"--hbm-bytes", std::to_string(64 << 20)});
  client::ClientOptions options;
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

// The engine's side of T0: a co-located engine resuming from chunks the daemon holds in
// HBM copies them out of the daemon's device memory over CUDA IPC (not by Fetch), and its
// logits are those of the same resume from chunks fetched from RAM — and of a cold prefill
// (exact replay), bit for bit.
TEST(HbmIpcTest, AnEngineResumesFromChunksReadOutOfHbm) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the HBM tier cannot start here";
  testing::TempDir dir;
  testing::Daemon daemon(dir.File("data"), {"--hbm-bytes", std::to_string(64 << 20)});
  const std::string config = testing::ReadFile(std::string(KVC_SOURCE_DIR) + "/configs/mini.json");
  const ModelConfig c = *ParseModelConfig(config);
  const uint64_t seed = testing::FreshSeed();
  const std::string w = dir.File("mini.safetensors");
  ASSERT_TRUE(model::WriteRandomWeights(c, *BuildLayerSchedule(c), seed, w).ok());
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Load(c, w);
  ASSERT_TRUE(m.ok()) << m.status();
  serve::ConnectorOptions o;
  o.client.address = daemon.address();
  o.client.timeout_ms = 5000;
  o.model_config_json = config;
  o.model_id = "mini-hbm";
  o.replay = model::ReplayMode::kExact;
  std::unique_ptr<serve::CacheConnector> fetching = serve::CacheConnector::Create(**m, o);
  ASSERT_TRUE(fetching->connected()) << fetching->connect_error();
  const int64_t C = (*m)->layout().chunk_tokens;
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> prompt(5 * C + 9);
  for (uint32_t& t : prompt) t = static_cast<uint32_t>(3 + rng() % 500);

  // Cold, its chunks stored; then resumed from RAM by Fetch.
  model::Sequence s0 = (*m)->NewSequence(), s1 = (*m)->NewSequence(), s2 = (*m)->NewSequence();
  serve::TurnReport r0, r1, r2;
  absl::StatusOr<std::vector<float>> cold = fetching->Prefill(s0, prompt, &r0);
  ASSERT_TRUE(cold.ok()) << cold.status();
  fetching->StoreNewChunks(s0);
  ASSERT_EQ(fetching->Drain(), 5);
  absl::StatusOr<std::vector<float>> from_ram = fetching->Prefill(s1, prompt, &r1);
  ASSERT_TRUE(from_ram.ok()) << from_ram.status();
  EXPECT_EQ(r1.reused_tokens, 5 * C);
  EXPECT_EQ(r1.hbm_chunks, 0);

  // A lease brings them into HBM; an engine with the reader then copies them out of it.
  auto* client = dynamic_cast<CacheClient*>(fetching->client());
  ASSERT_NE(client, nullptr);
  absl::StatusOr<DeviceRefs> refs =
      client->FetchDeviceRefs(*fetching->ns(), client->Keys(*fetching->ns(), prompt));
  ASSERT_TRUE(refs.ok()) << refs.status();
  ASSERT_EQ(refs->chunks.size(), 5u);
  ASSERT_TRUE(client->ReleaseDeviceRefs(refs->lease_id).ok());
  o.hbm_reader = model::MakeHbmChunkReader();
  ASSERT_TRUE(o.hbm_reader != nullptr);
  std::unique_ptr<serve::CacheConnector> reading = serve::CacheConnector::Create(**m, o);
  absl::StatusOr<std::vector<float>> from_hbm = reading->Prefill(s2, prompt, &r2);
  ASSERT_TRUE(from_hbm.ok()) << from_hbm.status();
  EXPECT_EQ(r2.tier, "hbm");
  EXPECT_EQ(r2.reused_tokens, 5 * C);
  EXPECT_EQ(r2.hbm_chunks, 5);
  EXPECT_TRUE(r2.warnings.empty()) << r2.warnings.front();
  EXPECT_TRUE(testing::SameBits(*from_hbm, *from_ram)) << "seed " << seed;
  EXPECT_TRUE(testing::SameBits(*from_hbm, *cold)) << "seed " << seed;

  // Any process that maps the arena can write it: one byte of chunk 2's device copy
  // changed (through a mapping of this process's own, closed before the engine maps it
  // again), the engine uses chunks 0 and 1 from HBM, fetches the rest, says why — and its
  // logits are still the cold prefill's.
  reading.reset();
  o.hbm_reader = nullptr;
  refs = client->FetchDeviceRefs(*fetching->ns(), client->Keys(*fetching->ns(), prompt));
  ASSERT_TRUE(refs.ok()) << refs.status();
  ASSERT_EQ(refs->chunks.size(), 5u);
  {
    absl::StatusOr<std::unique_ptr<MappedHbmArena>> arena =
        MappedHbmArena::Open(refs->ipc_handle, refs->device);
    ASSERT_TRUE(arena.ok()) << arena.status();
    uint8_t* at = const_cast<uint8_t*>((*arena)->base()) + refs->chunks[2].offset +
                  rng() % refs->chunks[2].length;
    uint8_t byte = 0;
    ASSERT_EQ(cudaMemcpy(&byte, at, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    byte ^= static_cast<uint8_t>(1 + rng() % 255);
    ASSERT_EQ(cudaMemcpy(at, &byte, 1, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ASSERT_TRUE(client->ReleaseDeviceRefs(refs->lease_id).ok());
  o.hbm_reader = model::MakeHbmChunkReader();
  reading = serve::CacheConnector::Create(**m, o);
  model::Sequence s3 = (*m)->NewSequence();
  serve::TurnReport r3;
  absl::StatusOr<std::vector<float>> past_bad = reading->Prefill(s3, prompt, &r3);
  ASSERT_TRUE(past_bad.ok()) << past_bad.status();
  EXPECT_EQ(r3.hbm_chunks, 2);
  EXPECT_EQ(r3.reused_tokens, 5 * C);
  ASSERT_EQ(r3.warnings.size(), 1u);
  EXPECT_NE(r3.warnings[0].find("HBM chunk 2 of 5 does not match its checksum"), std::string::npos)
      << r3.warnings[0];
  EXPECT_TRUE(testing::SameBits(*past_bad, *cold)) << "seed " << seed;
}

}  // namespace
}  // namespace kvc::cuda
