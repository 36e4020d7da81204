// CacheConnector: the engine's link to kvcached. For each request it hashes the prompt,
// looks up how much of it is cached, fetches those chunks straight into the engine's page
// layout (on another thread, while the engine runs the layers that read no page) and
// resumes from them; afterwards it stores every newly completed chunk in the
// background. Anything the cache cannot give — a miss, a chunk evicted between Lookup and
// Fetch, a page that does not decode, a dead or slow service — degrades to a cold
// prefill with a warning, never to a failed request.
//
// Thread-compatible: one connector per worker thread (the stores it starts run on its
// own background thread; Drain waits for them).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "client/cache_api.h"
#include "engine/model/model.h"

namespace kvc::serve {

struct ConnectorOptions {
  client::ClientOptions client;   // address "H:P" (one kvcached) or "etcd://H:P" (a cluster)
  std::string model_config_json;  // registered as the namespace's config
  std::string model_id = "kvcache-engine";
  model::ReplayMode replay = model::ReplayMode::kBounded;
  model::PrefillMode cold_mode = model::PrefillMode::kCed;
  // Reads chunks leased in kvcached's HBM tier over CUDA IPC, for an engine on the daemon's
  // GPU (model::MakeHbmChunkReader): the chunks a lookup finds in HBM are copied out of the
  // daemon's device memory instead of sent by Fetch. Null: they come by Fetch like the rest.
  std::function<absl::Status(std::string_view ipc_handle, int device, uint64_t arena_id,
                             std::span<const uint64_t> offsets, uint64_t chunk_bytes,
                             std::span<uint8_t> out)>
      hbm_reader;
  // Test hook: runs between Lookup and Fetch (to evict a chunk in between).
  std::function<void(const std::vector<storage::ChunkKey>&)> after_lookup;
};

// What one request got from the cache, for reports.
struct TurnReport {
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;   // cached tokens the engine resumed from
  int64_t matched_tokens = 0;  // what Lookup said was cached (reused may be fewer)
  std::string tier =
      "none";  // where the reused chunks were: none, or the tiers joined by "+" (hbm, ram, ssd)
  // A cluster: the nodes that served the reused chunks, with how many each ("n0:12 n2:9").
  std::string nodes;
  int64_t replayed_tokens = 0;
  int64_t encoder_tokens = 0, decoder_tokens = 0;
  double lookup_ms = 0, fetch_ms = 0, compute_ms = 0, ttft_ms = 0;
  // How long the engine waited for the fetch after the layers that need no page (the
  // rest of fetch_ms was hidden behind them).
  double fetch_wait_ms = 0;
  uint64_t fetched_bytes = 0;
  int64_t hbm_chunks = 0;  // of those, the chunks copied out of the daemon's HBM over CUDA IPC
  std::vector<std::string> warnings;  // why the cache was not (fully) used
};

class CacheConnector {
 public:
  // Connects and registers the namespace. A service that cannot be reached is not an
  // error: the connector then runs every request cold and says so.
  static std::unique_ptr<CacheConnector> Create(const model::Model& model, ConnectorOptions o);
  ~CacheConnector();

  // Prefills `prompt` on the empty `seq`, resuming from the cache where it can. Returns
  // the last position's logits.
  absl::StatusOr<std::vector<float>> Prefill(model::Sequence& seq, std::span<const uint32_t> prompt,
                                             TurnReport* report);
  // Stores the sequence's complete chunks the cache does not hold yet (copied now, sent
  // in the background).
  void StoreNewChunks(const model::Sequence& seq);
  // Waits for the background stores; returns how many chunks they stored.
  int64_t Drain();
  bool connected() const { return ns_.has_value(); }
  const std::string& connect_error() const { return connect_error_; }
  client::CacheApi* client() { return client_.get(); }
  const client::RemoteNamespace* ns() const { return ns_ ? &*ns_ : nullptr; }

 private:
  CacheConnector(const model::Model& m, ConnectorOptions o) : model_(m), opt_(std::move(o)) {}
  void StoreLoop();
  // Copies the leading chunks of `keys` that the daemon's HBM tier holds into `pages` with
  // opt_.hbm_reader; returns how many (0, saying why in `warning`, when that fails). Each
  // copy is checked against the chunk's checksum; the count stops before the first that
  // fails (and `warning` says so).
  int64_t ReadFromHbm(client::CacheApi& client, std::span<const storage::ChunkKey> keys,
                      std::span<uint8_t> pages, std::string* warning);

  const model::Model& model_;
  ConnectorOptions opt_;
  std::unique_ptr<client::CacheApi> client_;
  std::optional<client::RemoteNamespace> ns_;
  std::string connect_error_;

  struct StoreJob {
    std::vector<uint32_t> tokens;  // the whole chunks' tokens, from the prefix start
    std::vector<uint8_t> pages;    // chunks [first, last)
    int64_t first = 0;
  };
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<StoreJob> jobs_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t stored_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread worker_;
};

}  // namespace kvc::serve
