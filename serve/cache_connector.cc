#include "serve/cache_connector.h"

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <future>
#include <map>

#include "absl/strings/str_cat.h"
#include "client/client.h"

namespace kvc::serve {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a) {
  return std::chrono::duration<double, std::milli>(Clock::now() - a).count();
}

}  // namespace

std::unique_ptr<CacheConnector> CacheConnector::Create(const model::Model& model,
                                                       ConnectorOptions o) {
  std::unique_ptr<CacheConnector> c(new CacheConnector(model, std::move(o)));
  absl::StatusOr<std::unique_ptr<client::CacheApi>> client = client::ConnectCache(c->opt_.client);
  if (!client.ok()) {
    c->connect_error_ = std::string(client.status().message());
  } else {
    c->client_ = *std::move(client);
    absl::StatusOr<client::RemoteNamespace> ns =
        c->client_->RegisterNamespace(c->opt_.model_config_json, c->opt_.model_id,
                                      static_cast<uint32_t>(model.layout().chunk_tokens));
    if (!ns.ok()) {
      c->connect_error_ = absl::StrCat("kvcached: ", ns.status().message());
    } else if (static_cast<int64_t>(ns->chunk_bytes) != model.layout().chunk_bytes) {
      c->connect_error_ =
          absl::StrCat("kvcached namespace has ", ns->chunk_bytes,
                       "-byte chunks; the engine's pages are ", model.layout().chunk_bytes);
    } else {
      c->ns_ = *ns;
    }
  }
  c->worker_ = std::thread([p = c.get()] { p->StoreLoop(); });
  return c;
}

CacheConnector::~CacheConnector() {
  Drain();
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

absl::StatusOr<std::vector<float>> CacheConnector::Prefill(model::Sequence& seq,
                                                           std::span<const uint32_t> prompt,
                                                           TurnReport* r) {
  const auto t0 = Clock::now();
  *r = TurnReport{};
  r->prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t C = model_.layout().chunk_tokens;
  const int64_t n = static_cast<int64_t>(prompt.size());
  // At least one token must be new: resume needs the last position computed.
  const int64_t usable = n > 0 ? (n - 1) / C : 0;
  std::vector<uint8_t> pages;
  int64_t got = 0;
  absl::StatusOr<std::vector<float>> logits = absl::UnknownError("not run");
  if (!ns_) {
    r->warnings.push_back(absl::StrCat("cache unavailable (", connect_error_, "): cold prefill"));
  } else if (usable > 0) {
    const auto tl = Clock::now();
    absl::StatusOr<client::LookupResult> look = client_->Lookup(*ns_, prompt.first(usable * C));
    r->lookup_ms = Ms(tl);
    if (!look.ok()) {
      r->warnings.push_back(
          absl::StrCat("lookup failed (", look.status().message(), "): cold prefill"));
    } else if (look->matched_chunks > 0) {
      r->matched_tokens = look->matched_chunks * C;
      const std::vector<storage::ChunkKey> keys(look->keys.begin(),
                                                look->keys.begin() + look->matched_chunks);
      if (opt_.after_lookup) opt_.after_lookup(keys);
      // Which tiers the prefix came from, fastest first ("hbm+ram", "ssd", …).
      using client::Tier;
      r->tier.clear();
      for (Tier t : {Tier::kHbm, Tier::kRam, Tier::kSsd, Tier::kRados}) {
        if (std::find(look->tiers.begin(), look->tiers.end(), t) != look->tiers.end())
          absl::StrAppend(&r->tier, r->tier.empty() ? "" : "+", client::TierName(t));
      }
      if (r->tier.empty()) r->tier = "none";
      std::map<std::string, int> per_node;
      for (const std::string& node : look->nodes) ++per_node[node];
      for (const auto& [node, count] : per_node) {
        absl::StrAppend(&r->nodes, r->nodes.empty() ? "" : " ", node, ":", count);
      }
      pages.resize(keys.size() * model_.layout().chunk_bytes);
      // The leading chunks in the daemon's HBM tier, for an engine that can read them there.
      size_t in_hbm = 0;
      while (opt_.hbm_reader && in_hbm < keys.size() && look->tiers[in_hbm] == client::Tier::kHbm)
        ++in_hbm;
      // Fetch on another thread while the engine runs the layers that read no page.
      std::string short_reason, hbm_warning;
      std::future<absl::StatusOr<size_t>> fetch =
          std::async(std::launch::async, [&]() -> absl::StatusOr<size_t> {
            const auto tf = Clock::now();
            const size_t cb = static_cast<size_t>(model_.layout().chunk_bytes);
            const size_t from_hbm =
                in_hbm == 0 ? 0
                            : static_cast<size_t>(ReadFromHbm(
                                  *client_, std::span(keys).first(in_hbm), pages, &hbm_warning));
            r->hbm_chunks = static_cast<int64_t>(from_hbm);
            absl::StatusOr<size_t> fetched = from_hbm;
            if (from_hbm < keys.size()) {
              fetched = client_->Fetch(*ns_, std::span(keys).subspan(from_hbm),
                                       std::span(pages).subspan(from_hbm * cb), &short_reason);
              if (fetched.ok()) {
                *fetched += from_hbm;
              } else if (from_hbm > 0) {  // what came from HBM is a prefix to resume from
                short_reason = std::string(fetched.status().message());
                fetched = from_hbm;
              }
            }
            r->fetch_ms = Ms(tf);
            return fetched;
          });
      const int64_t want = static_cast<int64_t>(keys.size());
      bool short_fetch = false;
      const auto tc = Clock::now();
      logits = model_.Resume(
          seq,
          [&]() -> absl::StatusOr<std::span<const uint8_t>> {
            const auto tw = Clock::now();
            absl::StatusOr<size_t> fetched = fetch.get();
            r->fetch_wait_ms = Ms(tw);
            if (!fetched.ok()) return fetched.status();
            got = static_cast<int64_t>(*fetched);
            r->fetched_bytes = got * model_.layout().chunk_bytes;
            if (got < want) {
              short_fetch = true;
              return absl::AbortedError("fewer chunks than looked up");
            }
            return std::span<const uint8_t>(pages);
          },
          want* C, prompt, opt_.replay);
      if (fetch.valid()) fetch.wait();  // Resume refused before asking for the pages
      if (!hbm_warning.empty()) r->warnings.push_back(hbm_warning);
      if (logits.ok()) {
        r->reused_tokens = want * C;
      } else {
        seq = model_.NewSequence();
        if (short_fetch) {
          r->warnings.push_back(absl::StrCat("chunk ", got, " of ", want,
                                             " could not be fetched after the lookup (",
                                             short_reason.empty() ? "gone" : short_reason,
                                             "): resuming from ", got * C, " tokens"));
          if (got > 0) {  // the pages before it are here: resume from them
            logits = model_.Resume(seq, std::span(pages).first(got * model_.layout().chunk_bytes),
                                   got * C, prompt, opt_.replay);
            if (logits.ok()) {
              r->reused_tokens = got * C;
            } else {
              seq = model_.NewSequence();
            }
          }
        }
        if (!logits.ok() && !short_fetch) {
          r->warnings.push_back(absl::StrCat("fetch or cached pages failed (",
                                             logits.status().message(), "): cold prefill"));
        }
      }
      r->compute_ms = Ms(tc) - r->fetch_wait_ms;
    }
  }
  if (r->reused_tokens == 0) {
    r->tier = "none";
    const auto tc = Clock::now();
    logits = model_.Prefill(seq, prompt, opt_.cold_mode);
    r->compute_ms = Ms(tc);
  }
  if (!logits.ok()) return logits.status();
  r->ttft_ms = Ms(t0);
  const model::ForwardStats& st = seq.last_stats();
  r->replayed_tokens = st.replayed_tokens;
  r->encoder_tokens = st.encoder_tokens;
  r->decoder_tokens = st.decoder_tokens;
  for (const std::string& w : r->warnings)
    std::fprintf(stderr, "kvcache: warning: %s\n", w.c_str());
  return logits;
}

int64_t CacheConnector::ReadFromHbm(client::CacheApi& client,
                                    std::span<const storage::ChunkKey> keys,
                                    std::span<uint8_t> pages, std::string* warning) {
  auto* direct = dynamic_cast<client::CacheClient*>(&client);
  if (direct == nullptr) return 0;  // a cluster: no one daemon's GPU to read from
  absl::StatusOr<client::DeviceRefs> refs = direct->FetchDeviceRefs(*ns_, keys);
  if (!refs.ok()) {
    *warning = absl::StrCat("HBM chunks not leased (", refs.status().message(), "): fetched");
    return 0;
  }
  if (refs->lease_id == 0) return 0;
  const uint64_t cb = static_cast<uint64_t>(model_.layout().chunk_bytes);
  std::vector<uint64_t> offsets;
  absl::Status read = absl::OkStatus();
  for (const client::DeviceRefs::Chunk& c : refs->chunks) {
    if (c.length != cb) {
      read = absl::DataLossError(
          absl::StrCat("an HBM chunk of ", c.length, " bytes; the engine's pages have ", cb));
      break;
    }
    offsets.push_back(c.offset);
  }
  if (read.ok()) {
    read = opt_.hbm_reader(refs->ipc_handle, refs->device, refs->arena_id, offsets, cb,
                           pages.first(offsets.size() * cb));
  }
  (void)direct->ReleaseDeviceRefs(refs->lease_id);  // the lease also ends by itself
  if (!read.ok()) {
    *warning = absl::StrCat("HBM chunks not read over CUDA IPC (", read.message(), "): fetched");
    return 0;
  }
  // Any process that maps the arena can write it: the copies are checked before use, and
  // the chunks from the first that fails on come over Fetch (verified by the server).
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (!refs->chunks[i].Verifies(pages.subspan(i * cb, cb))) {
      *warning = absl::StrCat("HBM chunk ", i, " of ", offsets.size(),
                              " does not match its checksum (its device copy was changed): "
                              "fetched from there on");
      return static_cast<int64_t>(i);
    }
  }
  return static_cast<int64_t>(offsets.size());
}

void CacheConnector::StoreNewChunks(const model::Sequence& seq) {
  if (!ns_) return;
  const int64_t C = model_.layout().chunk_tokens, chunks = seq.complete_chunks();
  if (chunks == 0) return;
  // Copy now (the sequence moves on); the cache skips chunks it already holds.
  StoreJob job;
  job.tokens.assign(seq.tokens().begin(), seq.tokens().begin() + chunks * C);
  for (int64_t c = 0; c < chunks; ++c) {
    std::span<const uint8_t> p = seq.page(c);
    job.pages.insert(job.pages.end(), p.begin(), p.end());
  }
  {
    MutexLock lk(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

int64_t CacheConnector::Drain() {
  MutexLock lk(mu_);
  while (!jobs_.empty() || busy_) cv_.wait(mu_);
  return stored_;
}

void CacheConnector::StoreLoop() {
  MutexLock lk(mu_);
  while (true) {
    while (!stop_ && jobs_.empty()) cv_.wait(mu_);
    if (jobs_.empty()) return;
    StoreJob job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lk.unlock();
    // Skip the chunks already cached (one Lookup), store the rest chained after them.
    const int64_t C = model_.layout().chunk_tokens, bytes = model_.layout().chunk_bytes;
    int64_t have = 0;
    std::optional<storage::ChunkKey> parent;
    if (absl::StatusOr<client::LookupResult> l = client_->Lookup(*ns_, job.tokens); l.ok()) {
      have = l->matched_chunks;
      if (have > 0) parent = l->keys[have - 1];
    }
    const int64_t total = static_cast<int64_t>(job.tokens.size()) / C;
    int64_t stored = 0;
    if (have < total) {
      absl::StatusOr<client::StoreResult> s =
          client_->Store(*ns_, parent, std::span(job.tokens).subspan(have * C),
                         std::span(job.pages).subspan(have * bytes), client::Durability::kDurable);
      if (s.ok()) {
        stored = s->stored;
      } else {
        std::fprintf(stderr, "kvcache: warning: storing %lld chunks failed: %s\n",
                     static_cast<long long>(total - have),
                     std::string(s.status().message()).c_str());
      }
    }
    lk.lock();
    stored_ += stored;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace kvc::serve
