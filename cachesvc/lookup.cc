// Lookup: which leading chunks of a prefix are cached, and in which tier. The caller
// gives the tokens (the daemon hashes them) or the keys it computed (packed end to end,
// or one string each); the answer counts the leading chunks present.
#include "cachesvc/service_impl.h"

namespace kvc::cachesvc {

absl::Status KvCacheService::Impl::DoLookup(const std::string& tenant, const pb::LookupRequest& req,
                                            pb::LookupResponse* resp) {
  KVC_ASSIGN_OR_RETURN(NamespaceInfo ns, Namespace(req.namespace_id(), tenant));
  std::vector<ChunkKey> keys;
  const bool packed = !req.packed_chunk_keys().empty();
  const bool by_key = packed || req.chunk_keys_size() > 0;
  if (by_key) {
    if (req.tokens_size() > 0 || (packed && req.chunk_keys_size() > 0)) {
      return absl::InvalidArgumentError(
          "a Lookup gives one of tokens, chunk_keys and packed_chunk_keys");
    }
    // The keys of a max_lookup_tokens prefix at the namespace's chunk size, and never more
    // than any call may name (max_keys_per_call): a caller-keyed namespace that does not
    // say its page size (chunk_tokens 0) gets the same bound as a token namespace, so one
    // tenant's Lookup cannot take a thread for millions of keys.
    const uint64_t limit = opt.max_lookup_tokens / std::max<uint32_t>(1, ns.chunk_tokens);
    const auto max_keys = static_cast<uint32_t>(std::min<uint64_t>(limit, opt.max_keys_per_call));
    KVC_ASSIGN_OR_RETURN(std::vector<ChunkKey> parsed,
                         packed ? wire::UnpackKeys(req.packed_chunk_keys(), max_keys)
                                : ParseKeys(req.chunk_keys(), max_keys));
    keys = std::move(parsed);
    resp->set_keys_seen(static_cast<uint32_t>(keys.size()));
  } else {
    if (ns.key_mode == kKeysFromCaller) {
      return absl::InvalidArgumentError(
          absl::StrCat("namespace ", ns.id, " is caller-keyed: look up by chunk keys, not tokens"));
    }
    if (static_cast<uint64_t>(req.tokens_size()) > opt.max_lookup_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          req.tokens_size(), " tokens in one Lookup; the limit is ", opt.max_lookup_tokens));
    }
    if (static_cast<uint64_t>(req.tokens_size()) / ns.chunk_tokens > opt.max_keys_per_call) {
      return absl::InvalidArgumentError(absl::StrCat(
          req.tokens_size(), " tokens are ", req.tokens_size() / ns.chunk_tokens,
          " chunks of namespace ", ns.id, "; one Lookup covers at most ", opt.max_keys_per_call));
    }
    KVC_RETURN_IF_ERROR(CheckTokens(ns, req.tokens()));
    keys = client::ChunkKeys(ns.root, std::span(req.tokens().data(), req.tokens().size()),
                             ns.chunk_tokens);
  }
  // Only the leading run is reported unless every chunk's tier is asked for: past the first
  // miss nothing is probed.
  const std::vector<ChunkKey> stored = StorageKeys(ns, keys);
  const std::vector<storage::Tier> tiers =
      store->Lookup(ns.store_id, stored, /*leading_only=*/!req.every_chunk());
  if (opt.tombstones != nullptr && req.every_chunk()) {  // a cluster client's question
    for (size_t i = 0; i < stored.size(); ++i) {
      if (opt.tombstones->Deleted(ns.store_id, stored[i])) {
        resp->add_deleted_chunks(static_cast<uint32_t>(i));
      }
    }
  }
  uint32_t matched = 0;
  while (matched < tiers.size() && tiers[matched] != storage::Tier::kNone) ++matched;
  resp->set_matched_chunks(matched);
  // Tokens by the tier that serves them: the leading run's by its chunks' tiers, the rest
  // "none" — per namespace they add up to the tokens looked up. A cluster client's
  // every_chunk question is one node's share: not counted here (the client counts).
  if (opt.metrics != nullptr && !req.every_chunk() && ns.chunk_tokens > 0) {
    uint64_t by_tier[4] = {0, 0, 0, 0};  // none, ram, ssd, hbm
    for (uint32_t i = 0; i < matched; ++i) {
      const storage::Tier t = tiers[i];
      ++by_tier[t == storage::Tier::kRam ? 1 : t == storage::Tier::kSsd ? 2 : 3];
    }
    by_tier[0] = keys.size() - matched;
    static constexpr const char* kNames[4] = {"none", "ram", "ssd", "hbm"};
    for (int t = 0; t < 4; ++t) {
      opt.metrics->AddLookupTokens(tenant, ns.id, kNames[t], by_tier[t] * ns.chunk_tokens);
    }
  }
  if (!by_key) {
    for (const ChunkKey& k : keys) resp->add_chunk_keys(KeyBytes(k));
  }
  const size_t reported = req.every_chunk() ? tiers.size() : matched;
  for (size_t i = 0; i < reported; ++i) resp->add_tiers(ToProto(tiers[i]));
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
