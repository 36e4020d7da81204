#include "bench/kvbench/storage_bench.h"
#include "bench/kvbench/report.h"

#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/kvbench/block_device.h"
#include "bench/kvbench/harness.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"

namespace kvc::bench {
namespace {

using storage::ChunkKey;
constexpr storage::NamespaceId kNs = 1;
// Slots beyond the data set in our SSD tier, for the store runs (erased after each); fio's
// store file is as large: 8,192 chunks, at most 2 GiB of them (a 4.5 MB page's 8,192
// would be 36 GB), at least 64.
uint64_t StoreRoomChunks(uint64_t chunk_bytes) {
  return std::clamp<uint64_t>((2ull << 30) / storage::SlotBytesFor(chunk_bytes), 64, 8192);
}
// A batch fetch from SSD reads a prefix of this many times the depth per call.
constexpr size_t kPrefixDepths = 8;

// CPU seconds (user + system) of this process and of the children it has waited for.
double CpuSeconds() {
  double total = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage u{};
    getrusage(who, &u);
    total += static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
             static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }
  return total;
}

ChunkKey KeyFor(uint64_t n) {
  ChunkKey k;
  uint64_t x = n * 0x9E3779B97F4A7C15ull + 0x1234567;
  for (int half = 0; half < 2; ++half) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    std::memcpy(k.bytes.data() + 8 * half, &x, 8);
  }
  return k;
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

class System {
 public:
  virtual ~System() = default;
  virtual std::string name() const = 0;
  // "concurrent": depth d = d operations kept in flight (fio's iodepth, d threads);
  // "batch": one caller moving d chunks per call.
  virtual std::string mode() const { return "concurrent"; }
  virtual bool Supports(const std::string& op) const = 0;
  virtual absl::Status Prepare() = 0;
  virtual absl::StatusOr<Sample> Run(const std::string& op, int depth, double seconds) = 0;
};

struct Shared {
  StorageBenchOptions opt;
  std::vector<uint8_t> payload;    // what every store writes
  uint64_t next_key = 1ull << 40;  // fresh keys for store runs
};

// ---- ours ----

// Ours. `concurrent`: depth d means d callers each moving one chunk at a time (a server
// with d requests in flight, as fio-jobs and the threaded peers work); otherwise one caller
// (`batch`): it stores d chunks per PutBatch (one group commit), and fetches from the RAM
// tier d chunks per GetBatch; from SSD, a prefix of kPrefixDepths·d chunks per GetBatch
// with the store's queue depth d — d reads in flight from start to end, fio's iodepth.
//
// at_quota (kvcache-t2-quota): the namespace is in a quota group (storage/quota.h) whose
// SSD quota its chunks already fill, so every store first evicts the group's own oldest
// chunk — the cost a tenant pays at its --tenant-quota. Stores only (its fetch dataset
// is what the stores evict).
class KvcacheSystem final : public System {
 public:
  KvcacheSystem(Shared* sh, bool ssd, bool concurrent, bool at_quota = false)
      : sh_(sh), ssd_(ssd), concurrent_(concurrent), at_quota_(at_quota) {}
  std::string name() const override {
    return !ssd_ ? "kvcache-t1" : at_quota_ ? "kvcache-t2-quota" : "kvcache-t2";
  }
  std::string mode() const override { return concurrent_ ? "concurrent" : "batch"; }
  bool Supports(const std::string& op) const override { return !at_quota_ || op == "store"; }

  absl::Status Prepare() override {
    const uint64_t n = sh_->opt.dataset_chunks;
    storage::StoreOptions o;
    o.data_dir = sh_->opt.dir + "/" + name() + "-" + mode();
    o.max_chunk_bytes = sh_->opt.chunk_bytes;
    const uint64_t slot = storage::SlotBytesFor(sh_->opt.chunk_bytes);
    if (ssd_) {
      o.ssd_bytes = (n + StoreRoomChunks(sh_->opt.chunk_bytes)) *
                    slot;  // room for the store runs, erased after each
    } else {
      o.ram_bytes = n * slot;
    }
    o.queue_depth = 32;
    o.io_lanes = concurrent_ ? 32 : 2;  // one lane per concurrent caller
    o.slab_bytes = 256ull << 20;
    o.preallocate_ssd = true;  // as fio lays out its file before measuring
    options_ = o;
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkStore> s, storage::ChunkStore::Open(o));
    fetch_store_ = std::move(s);
    KVC_RETURN_IF_ERROR(fetch_store_->RegisterNamespace(kNs, sh_->opt.chunk_bytes));
    if (!ssd_) {  // stores into a small, always-full RAM tier: steady-state eviction
      storage::StoreOptions so = o;
      so.data_dir = o.data_dir + "-store";
      so.ram_bytes = 256 * slot;
      KVC_ASSIGN_OR_RETURN(std::unique_ptr<storage::ChunkStore> s2, storage::ChunkStore::Open(so));
      store_store_ = std::move(s2);
      KVC_RETURN_IF_ERROR(store_store_->RegisterNamespace(kNs, sh_->opt.chunk_bytes));
    }
    for (uint64_t i = 0; i < n; i += 32) {
      std::vector<storage::PutRequest> reqs;
      for (uint64_t k = i; k < std::min(n, i + 32); ++k)
        reqs.push_back({kNs, KeyFor(k), {}, sh_->payload});
      for (auto& r : fetch_store_->PutBatch(
               reqs, {ssd_ ? storage::Durability::kDurable : storage::Durability::kMemory, 0})) {
        if (!r.ok()) return r.status();
      }
    }
    if (at_quota_) {
      constexpr storage::QuotaGroup kGroup = 1;
      if (absl::Status st =
              fetch_store_->SetQuota(kGroup, {"the bench tenant", 0, n * sh_->opt.chunk_bytes, 0});
          !st.ok()) {
        return st;
      }
      fetch_store_->SetQuotaGroup(kNs, kGroup);
    }
    outs_.assign(32, std::vector<uint8_t>(sh_->opt.chunk_bytes));
    return absl::OkStatus();
  }

  absl::StatusOr<Sample> Run(const std::string& op, int depth, double seconds) override {
    if (concurrent_) return RunConcurrent(op, depth, seconds);
    KVC_RETURN_IF_ERROR(UseQueueDepth(depth));
    std::mt19937_64 rng(depth);
    const uint64_t batch_bytes = depth * sh_->opt.chunk_bytes;
    if (op == "fetch") {
      // Into buffers with room for the slot (ReadRoomFor), as kvcached's Fetch reads: a chunk
      // from SSD lands in place, with no copy out of a staging buffer.
      const size_t n = ssd_ ? kPrefixDepths * depth : depth;
      const storage::ChunkStore::ReadRoom room = fetch_store_->ReadRoomFor(sh_->opt.chunk_bytes);
      while (rooms_.size() < n) {
        rooms_.push_back(storage::AllocateReadBuffer(room));
        if (!rooms_.back()) {
          return absl::ResourceExhaustedError(
              absl::StrCat("cannot allocate ", n, " read buffers of ", room.bytes, " bytes"));
        }
        std::memset(rooms_.back().get(), 0, room.bytes);
      }
      std::vector<std::span<uint8_t>> outs;
      for (size_t i = 0; i < n; ++i)
        outs.emplace_back(rooms_[i].get() + room.before, sh_->opt.chunk_bytes);
      std::vector<ChunkKey> keys(n);
      return Loop(seconds, n * sh_->opt.chunk_bytes, [&](uint64_t) -> absl::Status {
        for (auto& k : keys) k = KeyFor(rng() % sh_->opt.dataset_chunks);
        for (const absl::Status& st :
             fetch_store_->GetBatch(kNs, keys, outs, nullptr, /*outs_have_read_room=*/true)) {
          if (!st.ok()) return st;
        }
        return absl::OkStatus();
      });
    }
    storage::ChunkStore& store = ssd_ ? *fetch_store_ : *store_store_;
    std::vector<ChunkKey> written;
    absl::StatusOr<Sample> s = Loop(seconds, batch_bytes, [&](uint64_t) -> absl::Status {
      std::vector<storage::PutRequest> reqs;
      for (int i = 0; i < depth; ++i) {
        written.push_back(KeyFor(sh_->next_key++));
        reqs.push_back({kNs, written.back(), {}, sh_->payload});
      }
      const auto d = ssd_ ? storage::Durability::kDurable : storage::Durability::kMemory;
      for (auto& r : store.PutBatch(reqs, {d, 0})) {
        if (!r.ok()) return r.status();
      }
      return absl::OkStatus();
    });
    store.EraseBatch(kNs, written);  // untimed: keep the folder's size steady
    return s;
  }

  // Batch runs on SSD keep `depth` I/Os in flight: the store is reopened (untimed) with that
  // queue depth.
  absl::Status UseQueueDepth(int depth) {
    if (!ssd_ || concurrent_ || options_.queue_depth == static_cast<unsigned>(depth))
      return absl::OkStatus();
    fetch_store_.reset();
    options_.queue_depth = static_cast<unsigned>(depth);
    KVC_ASSIGN_OR_RETURN(fetch_store_, storage::ChunkStore::Open(options_));
    return fetch_store_->RegisterNamespace(kNs, sh_->opt.chunk_bytes);
  }

  absl::StatusOr<Sample> RunConcurrent(const std::string& op, int depth, double seconds) {
    const uint64_t c = sh_->opt.chunk_bytes;
    if (op == "fetch") {
      return LoopThreads(seconds, depth, c, [&](int t, uint64_t i) {
        const ChunkKey k = KeyFor((i * 7919 + t * 104729) % sh_->opt.dataset_chunks);
        return fetch_store_->Get(kNs, k, outs_[t]);
      });
    }
    storage::ChunkStore& store = ssd_ ? *fetch_store_ : *store_store_;
    std::atomic<uint64_t> next{sh_->next_key};
    const auto d = ssd_ ? storage::Durability::kDurable : storage::Durability::kMemory;
    absl::StatusOr<Sample> s = LoopThreads(seconds, depth, c, [&](int, uint64_t) {
      return store.Put({kNs, KeyFor(next++), {}, sh_->payload}, {d, 0}).status();
    });
    std::vector<ChunkKey> written;
    for (uint64_t n = sh_->next_key; n < next; ++n) written.push_back(KeyFor(n));
    store.EraseBatch(kNs, written);
    sh_->next_key = next;
    return s;
  }

 private:
  Shared* sh_;
  bool ssd_;
  bool concurrent_;
  bool at_quota_;
  storage::StoreOptions options_;  // the fetch store's
  std::unique_ptr<storage::ChunkStore> fetch_store_, store_store_;
  std::vector<std::vector<uint8_t>> outs_;
  std::vector<storage::ReadBuffer> rooms_;  // batch fetches' buffers (ReadRoomFor)
};

// ---- peers ----

class MemcpySystem final : public System {
 public:
  explicit MemcpySystem(Shared* sh) : sh_(sh) {}
  std::string name() const override { return "memcpy"; }
  std::string mode() const override { return "batch"; }
  bool Supports(const std::string&) const override { return true; }
  absl::Status Prepare() override {
    arena_.assign(sh_->opt.dataset_chunks * sh_->opt.chunk_bytes, 0);
    for (uint64_t i = 0; i < sh_->opt.dataset_chunks; ++i) {
      std::memcpy(arena_.data() + i * sh_->opt.chunk_bytes, sh_->payload.data(),
                  sh_->opt.chunk_bytes);
    }
    outs_.assign(32, std::vector<uint8_t>(sh_->opt.chunk_bytes));
    return absl::OkStatus();
  }
  absl::StatusOr<Sample> Run(const std::string& op, int depth, double seconds) override {
    std::mt19937_64 rng(depth);
    const uint64_t c = sh_->opt.chunk_bytes;
    return Loop(seconds, depth * c, [&](uint64_t) {
      for (int i = 0; i < depth; ++i) {
        uint8_t* slot = arena_.data() + (rng() % sh_->opt.dataset_chunks) * c;
        if (op == "fetch") {
          std::memcpy(outs_[i].data(), slot, c);
        } else {
          std::memcpy(slot, sh_->payload.data(), c);
        }
      }
      return absl::OkStatus();
    });
  }

 private:
  Shared* sh_;
  std::vector<uint8_t> arena_;
  std::vector<std::vector<uint8_t>> outs_;
};

// fio, in three shapes. `fio`: one job keeping `depth` I/Os in flight (our batch mode's
// shape: one submitter); for writes, a fdatasync every `depth` writes — fio's io_uring
// engine queues that sync alongside the next writes, so no write ever waits for one (the
// device's pipelined best). `fio-jobs` (fetch only): `depth` jobs, each with one read in
// flight (our concurrent mode's shape: `depth` callers, each waiting for its chunk).
// `fio-sync-each` (store only): `depth` jobs, each writing one chunk and then fdatasyncing
// it before the next — the rule our durable puts keep (nothing is acknowledged before a
// sync that began after its write completed), for `depth` concurrent writers.
class FioSystem final : public System {
 public:
  enum class Shape { kPipelined, kJobs, kSyncEach };
  FioSystem(Shared* sh, Shape shape) : sh_(sh), shape_(shape) {}
  std::string name() const override { return kShapes[static_cast<int>(shape_)].name; }
  bool Supports(const std::string& op) const override {
    const char* only = kShapes[static_cast<int>(shape_)].only_op;
    return only == nullptr || op == only;
  }
  absl::Status Prepare() override {
    if (std::system("fio --version >/dev/null 2>&1") != 0) {
      return absl::FailedPreconditionError(
          "fio is not installed (scripts/install-deps.sh installs it)");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Sample> Run(const std::string& op, int depth, double seconds) override {
    // Same I/O size as one of our slots, same depth, O_DIRECT io_uring (the sync rule of
    // each shape: the class comment).
    const uint64_t bs = (storage::kSlotHeaderBytes + sh_->opt.chunk_bytes + 4095) / 4096 * 4096;
    // Reads come from a file of the data set's size; writes go to one as large as our SSD
    // tier (the data set and the room for store runs): on a disk whose cache absorbs a
    // small file rewritten in place, a smaller file would flatter the peer.
    const bool store = op != "fetch";
    const uint64_t chunks =
        sh_->opt.dataset_chunks + (store ? StoreRoomChunks(sh_->opt.chunk_bytes) : 0);
    const std::string shape =
        shape_ == Shape::kPipelined
            ? absl::StrFormat("--iodepth=%d%s", depth,
                              store ? absl::StrCat(" --fdatasync=", depth) : "")
            : absl::StrFormat("--numjobs=%d --iodepth=1%s --group_reporting", depth,
                              store ? " --fdatasync=1" : "");
    std::string cmd = absl::StrFormat(
        "fio --name=kvbench --filename=%s/fio-%s.dat --size=%d --bs=%d --rw=%s --ioengine=io_uring "
        "--direct=1 %s --runtime=%.3f --time_based --norandommap --randrepeat=0 "
        "--fixedbufs --registerfiles --output-format=json --eta=never 2>&1",
        sh_->opt.dir, op, chunks * bs, bs, store ? "randwrite" : "randread", shape, seconds);
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return Errno("popen fio");
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int rc = pclose(p);
    const size_t brace = out.find('{');
    nlohmann::json j =
        nlohmann::json::parse(brace == std::string::npos ? "" : out.substr(brace), nullptr, false);
    if (rc != 0 || j.is_discarded() || !j.contains("jobs")) {
      return absl::InternalError(absl::StrCat("fio failed (", rc, "): ", out.substr(0, 300)));
    }
    const nlohmann::json& r = j["jobs"][0][op == "fetch" ? "read" : "write"];
    Sample s;
    s.seconds = r["runtime"].get<double>() / 1000.0;
    s.bytes = r["io_bytes"].get<uint64_t>();
    // Scale to payload bytes so every system reports chunk payload moved per second.
    s.bytes = static_cast<uint64_t>(static_cast<double>(s.bytes) * sh_->opt.chunk_bytes / bs);
    const nlohmann::json& pct = r["clat_ns"]["percentile"];
    s.p50_us = pct.value("50.000000", 0.0) / 1000.0;
    s.p99_us = pct.value("99.000000", 0.0) / 1000.0;
    return s;
  }

 private:
  // By Shape: the system's name, and the one op it runs (null: both).
  static constexpr struct {
    const char* name;
    const char* only_op;
  } kShapes[] = {{"fio", nullptr}, {"fio-jobs", "fetch"}, {"fio-sync-each", "store"}};
  Shared* sh_;
  Shape shape_;
};

class FilePerChunkSystem final : public System {
 public:
  explicit FilePerChunkSystem(Shared* sh) : sh_(sh), dir_(sh->opt.dir + "/file-per-chunk") {}
  std::string name() const override { return "file-per-chunk"; }
  bool Supports(const std::string&) const override { return true; }
  std::string Path(uint64_t n) const { return absl::StrFormat("%s/%d.bin", dir_, n); }

  absl::Status WriteFile(const std::string& path) {
    const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("open " + path);
    const bool ok = write(fd, sh_->payload.data(), sh_->payload.size()) ==
                        static_cast<ssize_t>(sh_->payload.size()) &&
                    fdatasync(fd) == 0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return ok ? absl::OkStatus() : Errno("write " + path);
  }

  absl::Status Prepare() override {
    std::filesystem::create_directories(dir_);
    for (uint64_t i = 0; i < sh_->opt.dataset_chunks; ++i) {
      KVC_RETURN_IF_ERROR(WriteFile(Path(i)));
    }
    outs_.assign(32, std::vector<uint8_t>(sh_->opt.chunk_bytes));
    return absl::OkStatus();
  }

  absl::StatusOr<Sample> Run(const std::string& op, int depth, double seconds) override {
    const uint64_t c = sh_->opt.chunk_bytes;
    if (op == "fetch") {
      return LoopThreads(seconds, depth, c, [&](int t, uint64_t i) -> absl::Status {
        const std::string path = Path((i * 7919 + t * 104729) % sh_->opt.dataset_chunks);
        const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return Errno("open " + path);
        const ssize_t n = pread(fd, outs_[t].data(), c, 0);
        // Drop the pages again so the next read of this file goes to the disk too.
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
        return n == static_cast<ssize_t>(c) ? absl::OkStatus() : Errno("read " + path);
      });
    }
    std::atomic<uint64_t> next{sh_->next_key};
    absl::StatusOr<Sample> s =
        LoopThreads(seconds, depth, c, [&](int, uint64_t) { return WriteFile(Path(next++)); });
    for (uint64_t n = sh_->next_key; n < next; ++n) unlink(Path(n).c_str());
    sh_->next_key = next;
    return s;
  }

 private:
  Shared* sh_;
  std::string dir_;
  std::vector<std::vector<uint8_t>> outs_;
};

class RocksBlobSystem final : public System {
 public:
  explicit RocksBlobSystem(Shared* sh) : sh_(sh) {}
  ~RocksBlobSystem() override {
    if (db_) (void)db_->Close();
  }
  std::string name() const override { return "rocksdb-blob"; }
  bool Supports(const std::string&) const override { return true; }
  static std::string Key(uint64_t n) {
    const ChunkKey k = KeyFor(n);
    return std::string(reinterpret_cast<const char*>(k.bytes.data()), 16);
  }

  absl::Status Prepare() override {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.enable_blob_files = true;
    o.min_blob_size = 4096;
    o.blob_file_size = 256 << 20;
    o.use_direct_reads = true;  // like our O_DIRECT reads: measure the disk, not the page cache
    o.use_direct_io_for_flush_and_compaction = true;
    o.write_buffer_size = 64 << 20;
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(o, sh_->opt.dir + "/rocksdb-blob", &db);
    if (!s.ok()) return absl::InternalError("rocksdb open: " + s.ToString());
    db_.reset(db);
    const rocksdb::Slice value(reinterpret_cast<const char*>(sh_->payload.data()),
                               sh_->payload.size());
    for (uint64_t i = 0; i < sh_->opt.dataset_chunks; ++i) {
      s = db_->Put(rocksdb::WriteOptions(), Key(i), value);
      if (!s.ok()) return absl::InternalError("rocksdb put: " + s.ToString());
    }
    s = db_->Flush(rocksdb::FlushOptions());
    return s.ok() ? absl::OkStatus() : absl::InternalError("rocksdb flush: " + s.ToString());
  }

  absl::StatusOr<Sample> Run(const std::string& op, int depth, double seconds) override {
    const uint64_t c = sh_->opt.chunk_bytes;
    if (op == "fetch") {
      return LoopThreads(seconds, depth, c, [&](int t, uint64_t i) -> absl::Status {
        std::string value;
        rocksdb::Status s = db_->Get(
            rocksdb::ReadOptions(), Key((i * 7919 + t * 104729) % sh_->opt.dataset_chunks), &value);
        return s.ok() && value.size() == c ? absl::OkStatus()
                                           : absl::InternalError("rocksdb get: " + s.ToString());
      });
    }
    std::atomic<uint64_t> next{sh_->next_key};
    rocksdb::WriteOptions w;
    w.sync = true;  // acknowledged = durable, as for our durable store
    const rocksdb::Slice value(reinterpret_cast<const char*>(sh_->payload.data()),
                               sh_->payload.size());
    absl::StatusOr<Sample> s = LoopThreads(seconds, depth, c, [&](int, uint64_t) -> absl::Status {
      rocksdb::Status st = db_->Put(w, Key(next++), value);
      return st.ok() ? absl::OkStatus() : absl::InternalError("rocksdb put: " + st.ToString());
    });
    for (uint64_t n = sh_->next_key; n < next; ++n)
      (void)db_->Delete(rocksdb::WriteOptions(), Key(n));
    sh_->next_key = next;
    return s;
  }

 private:
  Shared* sh_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace

absl::StatusOr<std::vector<BenchCase>> RunStorageBench(const StorageBenchOptions& opt) {
  std::error_code ec;
  std::filesystem::create_directories(opt.dir, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("cannot create ", opt.dir, ": ", ec.message()));
  Shared sh{opt, std::vector<uint8_t>(opt.chunk_bytes)};
  std::mt19937_64 rng(opt.chunk_bytes);
  for (auto& b : sh.payload) b = static_cast<uint8_t>(rng());

  std::vector<std::unique_ptr<System>> systems;
  systems.push_back(std::make_unique<KvcacheSystem>(&sh, /*ssd=*/true, /*concurrent=*/true));
  systems.push_back(std::make_unique<KvcacheSystem>(&sh, /*ssd=*/true, /*concurrent=*/false));
  systems.push_back(std::make_unique<KvcacheSystem>(&sh, /*ssd=*/true, /*concurrent=*/true,
                                                    /*at_quota=*/true));
  if (opt.run_fio) {
    for (FioSystem::Shape shape :
         {FioSystem::Shape::kPipelined, FioSystem::Shape::kJobs, FioSystem::Shape::kSyncEach}) {
      systems.push_back(std::make_unique<FioSystem>(&sh, shape));
    }
  }
  systems.push_back(std::make_unique<FilePerChunkSystem>(&sh));
  systems.push_back(std::make_unique<RocksBlobSystem>(&sh));
  systems.push_back(std::make_unique<KvcacheSystem>(&sh, /*ssd=*/false, /*concurrent=*/false));
  systems.push_back(std::make_unique<MemcpySystem>(&sh));
  for (auto& s : systems) {
    std::fprintf(stderr, "kvbench: preparing %s (%s)\n", s->name().c_str(), s->mode().c_str());
    if (absl::Status st = s->Prepare(); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat(s->name(), ": ", st.message()));
    }
  }

  const std::optional<BlockDevice> device = BlockDevice::For(opt.dir);
  std::fprintf(stderr, "kvbench: block device under %s: %s\n", opt.dir.c_str(),
               device ? device->name().c_str() : "none (its counters are not reported)");
  std::vector<BenchCase> cases;
  for (const std::string& op : opt.ops) {
    for (int depth : opt.depths) {
      std::map<std::string, std::vector<Sample>> runs;
      std::map<std::string, std::vector<std::array<double, 3>>> device_runs;  // r, w GB/s; amp
      std::map<std::string, std::vector<double>> cpu_runs;                    // µs per chunk
      for (int rep = 0; rep < opt.repetitions; ++rep) {
        for (auto& s : systems) {  // A B C … A B C …: the disk's drift hits everyone alike
          if (!s->Supports(op)) continue;
          std::fprintf(stderr, "kvbench: %s (%s) %s depth %d run %d\n", s->name().c_str(),
                       s->mode().c_str(), op.c_str(), depth, rep + 1);
          const std::optional<DeviceBytes> before = device ? device->Read() : std::nullopt;
          const double cpu_before = CpuSeconds();
          absl::StatusOr<Sample> sample = s->Run(op, depth, opt.seconds);
          const double cpu = CpuSeconds() - cpu_before;
          const std::optional<DeviceBytes> after = device ? device->Read() : std::nullopt;
          if (sample.ok() && sample->bytes > 0) {
            cpu_runs[s->name() + "/" + s->mode()].push_back(cpu * 1e6 *
                                                            static_cast<double>(opt.chunk_bytes) /
                                                            static_cast<double>(sample->bytes));
          }
          if (sample.ok() && before && after && sample->seconds > 0) {
            const double r = static_cast<double>(after->read - before->read);
            const double w = static_cast<double>(after->written - before->written);
            device_runs[s->name() + "/" + s->mode()].push_back(
                {r / sample->seconds / 1e9, w / sample->seconds / 1e9,
                 sample->bytes > 0 ? (op == "fetch" ? r : w) / static_cast<double>(sample->bytes)
                                   : 0});
          }
          if (!sample.ok()) {
            return absl::Status(sample.status().code(),
                                absl::StrCat(s->name(), " ", op, ": ", sample.status().message()));
          }
          sample->Percentiles();
          runs[s->name() + "/" + s->mode()].push_back(*std::move(sample));
        }
      }
      for (auto& s : systems) {
        if (!s->Supports(op)) continue;
        std::vector<double> gbps, p50, p99;
        for (const Sample& x : runs[s->name() + "/" + s->mode()]) {
          gbps.push_back(x.gbps());
          p50.push_back(x.p50_us);
          p99.push_back(x.p99_us);
        }
        BenchCase c{s->name(), s->mode(), op, depth, Median(gbps), Median(p50), Median(p99)};
        c.cpu_us_per_chunk = Median(cpu_runs[s->name() + "/" + s->mode()]);
        if (const auto& d = device_runs[s->name() + "/" + s->mode()]; !d.empty()) {
          std::vector<double> rd, wr, amp;
          for (const auto& x : d) {
            rd.push_back(x[0]);
            wr.push_back(x[1]);
            amp.push_back(x[2]);
          }
          c.device_read_gbps = Median(rd);
          c.device_write_gbps = Median(wr);
          c.device_amplification = Median(amp);
        }
        cases.push_back(c);
      }
    }
  }
  systems.clear();
  std::filesystem::remove_all(opt.dir, ec);
  return cases;
}

nlohmann::json CasesToJson(const std::vector<BenchCase>& cases) {
  nlohmann::json j;
  j["cases"] = nlohmann::json::array();
  for (const BenchCase& c : cases) {
    j["cases"].push_back({{"system", c.system},
                          {"mode", c.mode},
                          {"op", c.op},
                          {"depth", c.depth},
                          {"gbps", c.gbps},
                          {"p50_us", c.p50_us},
                          {"p99_us", c.p99_us},
                          {"device_read_gbps", c.device_read_gbps},
                          {"device_write_gbps", c.device_write_gbps},
                          {"device_amplification", c.device_amplification},
                          {"cpu_us_per_chunk", c.cpu_us_per_chunk}});
  }
  return j;
}

std::string CasesToText(const std::vector<BenchCase>& cases) {
  std::string out = absl::StrFormat("%-6s %5s  %-15s %-10s %9s %10s %10s %9s %9s %6s %8s\n", "op",
                                    "depth", "system", "mode", "GB/s", "p50 us", "p99 us", "dev rd",
                                    "dev wr", "amp", "cpu us/c");
  std::map<std::tuple<std::string, int, std::string, std::string>, double> gbps;
  for (const BenchCase& c : cases) {
    absl::StrAppendFormat(&out, "%-6s %5d  %-15s %-10s %9.3f %10.1f %10.1f", c.op, c.depth,
                          c.system, c.mode, c.gbps, c.p50_us, c.p99_us);
    if (c.device_amplification >= 0) {
      absl::StrAppendFormat(&out, " %9.3f %9.3f %6.2f", c.device_read_gbps, c.device_write_gbps,
                            c.device_amplification);
    } else {
      out += "         -         -      -";
    }
    absl::StrAppendFormat(&out, " %8.1f\n", c.cpu_us_per_chunk);
    gbps[{c.op, c.depth, c.system, c.mode}] = c.gbps;
  }
  out += "\nratios (medians of alternated runs):\n";
  const struct {
    const char* ours;
    const char* ours_mode;
    const char* peer;
    const char* peer_mode;
    const char* op;
    double target;
  } ratios[] = {// Fetch targets against fio in the same shape: one submitter with `depth`
                // in flight (batch), `depth` callers with one each (concurrent).
                {"kvcache-t2", "batch", "fio", "concurrent", "fetch", 0.9},
                {"kvcache-t2", "concurrent", "fio-jobs", "concurrent", "fetch", 0.9},
                {"kvcache-t2", "concurrent", "fio", "concurrent", "fetch", 0},
                {"kvcache-t2", "concurrent", "fio-sync-each", "concurrent", "store", 0.9},
                {"kvcache-t2", "concurrent", "fio", "concurrent", "store", 0},
                {"kvcache-t2", "batch", "fio", "concurrent", "store", 0},
                {"kvcache-t1", "batch", "memcpy", "batch", "fetch", 0.8},
                {"kvcache-t2", "concurrent", "file-per-chunk", "concurrent", "fetch", 0},
                {"kvcache-t2", "concurrent", "rocksdb-blob", "concurrent", "fetch", 0},
                {"kvcache-t2", "concurrent", "file-per-chunk", "concurrent", "store", 0},
                {"kvcache-t2", "concurrent", "rocksdb-blob", "concurrent", "store", 0},
                {"kvcache-t2-quota", "concurrent", "kvcache-t2", "concurrent", "store", 0}};
  for (const auto& r : ratios) {
    for (const BenchCase& c : cases) {
      if (c.system != r.ours || c.mode != r.ours_mode || c.op != r.op) continue;
      auto peer = gbps.find({r.op, c.depth, r.peer, r.peer_mode});
      if (peer == gbps.end() || peer->second <= 0) continue;
      const double ratio = c.gbps / peer->second;
      absl::StrAppendFormat(&out, "  %-6s depth %2d  %s (%s) / %-15s %6.2f%s\n", r.op, c.depth,
                            r.ours, r.ours_mode, r.peer, ratio, RatioNote(ratio, r.target));
    }
  }
  return out;
}

}  // namespace kvc::bench
