#include "cachesvc/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"

namespace kvc::cachesvc {
namespace {

prometheus::ClientMetric Value(double v, std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = v;
  m.counter.value = v;
  return m;
}

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type,
                                std::vector<prometheus::ClientMetric> metrics) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  f.metric = std::move(metrics);
  return f;
}

// One sample per SSD size class, labelled with its slot bytes.
std::vector<prometheus::ClientMetric> ClassChunks(const storage::StoreStats& s) {
  std::vector<prometheus::ClientMetric> out;
  for (const storage::StoreStats::SsdClassStats& c : s.ssd_classes)
    out.push_back(
        Value(static_cast<double>(c.chunks), {{"slot_bytes", absl::StrCat(c.slot_bytes)}}));
  return out;
}

// Reads the store's statistics when Prometheus scrapes, so they are never stale.
class StoreCollector final : public prometheus::Collectable {
 public:
  explicit StoreCollector(const storage::ChunkStore* store) : store_(store) {}
  void SetRepairSource(std::function<void(kvcache::v1::RepairStats*)> source) {
    MutexLock lk(mu_);
    repair_ = std::move(source);
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out = StoreFamilies();
    std::function<void(kvcache::v1::RepairStats*)> source;
    {
      MutexLock lk(mu_);
      source = repair_;
    }
    if (source) {
      using T = prometheus::MetricType;
      kvcache::v1::RepairStats r;
      source(&r);
      auto add = [&](const char* name, const char* help, T type, double v) {
        out.push_back(Family(name, help, type, {Value(v)}));
      };
      add("kvcache_repair_under_replicated_chunks",
          "Chunks this node is to copy that lack a copy on one of their owners", T::Gauge,
          r.under_replicated_chunks());
      add("kvcache_repair_under_replicated_bytes", "Their payload bytes", T::Gauge,
          r.under_replicated_bytes());
      add("kvcache_repair_left_to_shared_tier_chunks",
          "Chunks short of a local copy on an owner that the shared tier holds (not copied)",
          T::Gauge, r.left_to_shared_tier_chunks());
      add("kvcache_repair_copied_chunks_total", "Chunk copies repair made to other nodes",
          T::Counter, r.copied_chunks());
      add("kvcache_repair_copied_bytes_total", "Payload bytes repair copied to other nodes",
          T::Counter, r.copied_bytes());
      add("kvcache_repair_failed_copies_total", "Chunk copies that failed", T::Counter,
          r.failed_copies());
      add("kvcache_repair_passes_total", "Repair passes completed over every chunk held",
          T::Counter, r.passes());
      add("kvcache_repair_last_pass_timestamp_seconds",
          "When the last complete repair pass ended (0: none yet)", T::Gauge, r.last_pass_unix_s());
      add("kvcache_repair_pending",
          "1 while the membership changed and no pass has completed since", T::Gauge,
          r.pending() ? 1 : 0);
      add("kvcache_repair_copy_bytes_per_second", "Copy rate over the running or last pass",
          T::Gauge, r.copy_bytes_per_s());
      add("kvcache_repair_unplaceable_chunks",
          "Chunks held without the client's key (stored by an older kvcached): not repaired",
          T::Gauge, r.unplaceable_chunks());
    }
    return out;
  }

 private:
  std::vector<prometheus::MetricFamily> StoreFamilies() const {
    using T = prometheus::MetricType;
    const storage::StoreStats s = store_->StatsNow();  // a scrape does not wait for a load
    auto tiers = [](double ram, double ssd) {
      return std::vector<prometheus::ClientMetric>{Value(ram, {{"tier", "ram"}}),
                                                   Value(ssd, {{"tier", "ssd"}})};
    };
    return {
        Family("kvcache_chunks", "Chunks held per tier", T::Gauge,
               tiers(s.ram_chunks, s.ssd_chunks)),
        Family("kvcache_capacity_chunks", "Chunk capacity per tier", T::Gauge,
               tiers(s.ram_capacity_chunks, s.ssd_capacity_chunks)),
        Family("kvcache_ssd_bytes",
               "SSD bytes charged to the chunks held (each its size class's slot)", T::Gauge,
               {Value(s.ssd_bytes)}),
        Family("kvcache_ssd_capacity_bytes", "The SSD tier's device budget, every size class",
               T::Gauge, {Value(s.ssd_capacity_bytes)}),
        Family("kvcache_ssd_class_chunks", "Chunks held per SSD size class (slot bytes)", T::Gauge,
               ClassChunks(s)),
        Family("kvcache_hits_total", "Chunk reads served per tier", T::Counter,
               tiers(s.ram_hits, s.ssd_hits)),
        Family("kvcache_evictions_total", "Chunks evicted per tier", T::Counter,
               tiers(s.ram_evictions, s.ssd_evictions)),
        Family("kvcache_misses_total", "Chunk reads that found nothing", T::Counter,
               {Value(s.misses)}),
        Family("kvcache_checksum_failures_total",
               "Chunk copies whose checksum did not verify (SSD reads and RAM copies)", T::Counter,
               {Value(s.checksum_failures)}),
        Family("kvcache_ram_checksum_failures_total",
               "RAM copies found corrupt (by a read, the scrub, or on their way out); dropped",
               T::Counter, {Value(s.ram_checksum_failures)}),
        Family("kvcache_ram_scrub_bytes_total", "Bytes of RAM copies verified by the scrub",
               T::Counter, {Value(s.ram_scrub_bytes)}),
        Family("kvcache_ram_scrub_passes_total", "Scrub passes completed over every RAM slot",
               T::Counter, {Value(s.ram_scrub_passes)}),
        Family("kvcache_ram_scrub_last_pass_timestamp_seconds",
               "When the last scrub pass over RAM completed (0: none yet)", T::Gauge,
               {Value(s.ram_scrub_last_pass_s)}),
        Family("kvcache_ram_scrub_progress_ratio", "How far the current scrub pass is (0..1)",
               T::Gauge, {Value(s.ram_scrub_progress)}),
        Family("kvcache_read_errors_total", "SSD read I/O errors", T::Counter,
               {Value(s.read_errors)}),
        Family("kvcache_write_errors_total", "SSD write I/O errors", T::Counter,
               {Value(s.write_errors)}),
        Family("kvcache_demotions_total", "RAM chunks written back to SSD under pressure",
               T::Counter, {Value(s.demotions)}),
        Family("kvcache_promotions_total", "SSD hits copied up to RAM", T::Counter,
               {Value(s.promotions)}),
        Family("kvcache_pending_write_behind", "Memory-acknowledged chunks not yet on SSD",
               T::Gauge, {Value(s.pending_write_behind)}),
        Family("kvcache_index_rebuilds_total",
               "Opens that found the SSD index damaged or missing and rebuilt it from the slots",
               T::Counter, {Value(s.index_rebuilds)}),
        Family("kvcache_index_loading",
               "1 while the SSD index loads after a start (lookups read it on disk meanwhile)",
               T::Gauge, {Value(s.index_loading ? 1 : 0)}),
        Family("kvcache_recovered_chunks",
               "Chunks indexed from their slots at the last open (entries the index lost)",
               T::Gauge, {Value(s.recovered_chunks)}),
        Family("kvcache_shared_tier_reachable",
               "1 while the shared tier (RADOS) answers; absent without one", T::Gauge,
               s.shared.name.empty()
                   ? std::vector<prometheus::ClientMetric>{}
                   : std::vector<prometheus::ClientMetric>{Value(s.shared.reachable ? 1 : 0)}),
        Family("kvcache_shared_tier_backlog_chunks",
               "Write-behind chunks not yet written to the shared tier", T::Gauge,
               {Value(s.shared.backlog_chunks)}),
        Family("kvcache_shared_tier_puts_total", "Chunks written to the shared tier", T::Counter,
               {Value(s.shared.puts)}),
        Family("kvcache_shared_tier_put_errors_total", "Writes to the shared tier that failed",
               T::Counter, {Value(s.shared.put_errors)}),
        Family("kvcache_shared_tier_hits_total",
               "Misses on this node served from the shared tier (and promoted)", T::Counter,
               {Value(s.shared.hits)}),
        Family("kvcache_shared_tier_read_errors_total",
               "Reads from the shared tier that failed (not misses)", T::Counter,
               {Value(s.shared.read_errors)}),
        Family("kvcache_shared_tier_swept_total",
               "Chunks past their TTL that sweeps removed from the shared tier", T::Counter,
               {Value(s.shared.swept)}),
        Family("kvcache_unreadable_slots_at_open",
               "SSD slots recovery could not read at the last open (their chunks not indexed)",
               T::Gauge, {Value(s.unreadable_slots_at_open)}),
    };
  }

  const storage::ChunkStore* store_;
  mutable Mutex mu_;
  std::function<void(kvcache::v1::RepairStats*)> repair_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

class ServiceMetrics::Impl {
 public:
  explicit Impl(const storage::ChunkStore* store)
      : registry(std::make_shared<prometheus::Registry>()),
        collector(std::make_shared<StoreCollector>(store)),
        rpc(prometheus::BuildHistogram()
                .Name("kvcache_rpc_seconds")
                .Help("Call latency by method and status")
                .Register(*registry)),
        bytes(prometheus::BuildCounter()
                  .Name("kvcache_bytes_total")
                  .Help("Chunk payload bytes by direction")
                  .Register(*registry)),
        bytes_in(bytes.Add({{"direction", "in"}})),
        bytes_out(bytes.Add({{"direction", "out"}})),
        lookup_tokens(prometheus::BuildCounter()
                          .Name("kvcache_lookup_tokens_total")
                          .Help("Tokens of the prefixes looked up, by namespace and the tier "
                                "that holds them (none: past the leading run)")
                          .Register(*registry)) {}

  std::shared_ptr<prometheus::Registry> registry;
  std::shared_ptr<StoreCollector> collector;
  prometheus::Family<prometheus::Histogram>& rpc;
  prometheus::Family<prometheus::Counter>& bytes;
  prometheus::Counter& bytes_in;
  prometheus::Counter& bytes_out;
  prometheus::Family<prometheus::Counter>& lookup_tokens;
  std::unique_ptr<prometheus::Exposer> exposer;
};

ServiceMetrics::ServiceMetrics(const storage::ChunkStore* store)
    : impl_(std::make_unique<Impl>(store)) {}
ServiceMetrics::~ServiceMetrics() = default;

void ServiceMetrics::ObserveCall(const std::string& method, grpc::StatusCode code, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10};
  // Family::Add returns the existing series for the same labels.
  impl_->rpc.Add({{"method", method}, {"code", std::to_string(static_cast<int>(code))}}, kBuckets)
      .Observe(seconds);
}

void ServiceMetrics::SetRepairSource(std::function<void(kvcache::v1::RepairStats*)> source) {
  impl_->collector->SetRepairSource(std::move(source));
}

void ServiceMetrics::AddLookupTokens(const std::string& tenant, uint32_t ns, const char* tier,
                                     uint64_t tokens) {
  if (tokens == 0) return;
  impl_->lookup_tokens.Add({{"tenant", tenant}, {"namespace", std::to_string(ns)}, {"tier", tier}})
      .Increment(static_cast<double>(tokens));
}

void ServiceMetrics::AddBytes(bool in, uint64_t n) {
  (in ? impl_->bytes_in : impl_->bytes_out).Increment(static_cast<double>(n));
}

absl::StatusOr<int> ServiceMetrics::Serve(const std::string& listen) {
  try {
    impl_->exposer = std::make_unique<prometheus::Exposer>(listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  impl_->exposer->RegisterCollectable(impl_->registry);
  impl_->exposer->RegisterCollectable(impl_->collector);
  const std::vector<int> ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports[0];
}

}  // namespace kvc::cachesvc
