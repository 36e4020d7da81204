// kvbench run as a user runs it, on a tiny data set: every system and op is reported in
// the JSON shape the docs promise, and bad flags fail with one line. Not a timing test.
#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace kvc {
namespace {

using ::kvc::testing::RunProgram;
using ::kvc::testing::TempDir;

const std::string kKvbench = std::string(KVC_BIN_DIR) + "/kvbench";

TEST(KvbenchTest, StorageJsonHasEveryCase) {
  TempDir dir;
  auto r = RunProgram(
      kKvbench, {"storage", "--dir", dir.File("scratch"), "--seconds", "0.2", "--reps", "1",
                 "--depths", "1,4", "--dataset-chunks", "8", "--chunk-bytes", "12000", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  std::set<std::string> seen;
  for (const auto& c : j["cases"]) {
    for (const char* field :
         {"system", "mode", "op", "depth", "gbps", "p50_us", "p99_us", "device_read_gbps",
          "device_write_gbps", "device_amplification", "cpu_us_per_chunk"}) {
      ASSERT_TRUE(c.contains(field)) << c.dump();
    }
    // Every system spends CPU on every chunk it moves (fio's is its own process's).
    EXPECT_GT(c["cpu_us_per_chunk"].get<double>(), 0) << c.dump();
    // The disk's own counters, where --dir has a block device: a store to the SSD tier
    // (O_DIRECT, synced) shows up as device writes during the run.
    if (c["device_amplification"].get<double>() >= 0 && c["system"] == "kvcache-t2" &&
        c["op"] == "store") {
      EXPECT_GT(c["device_write_gbps"].get<double>(), 0) << c.dump();
    }
    EXPECT_GT(c["gbps"].get<double>(), 0) << c.dump();
    EXPECT_LE(c["p50_us"].get<double>(), c["p99_us"].get<double>()) << c.dump();
    seen.insert(c["system"].get<std::string>() + "/" + c["op"].get<std::string>() + "/" +
                std::to_string(c["depth"].get<int>()));
  }
  for (const char* system :
       {"kvcache-t1", "kvcache-t2", "fio", "file-per-chunk", "rocksdb-blob", "memcpy"}) {
    for (const char* op : {"fetch", "store"}) {
      for (int depth : {1, 4}) {
        EXPECT_TRUE(seen.contains(std::string(system) + "/" + op + "/" + std::to_string(depth)))
            << system << " " << op << " " << depth;
      }
    }
  }
  // fio in our concurrent mode's shape (a job per caller) reads only.
  EXPECT_TRUE(seen.contains("fio-jobs/fetch/1"));
  EXPECT_TRUE(seen.contains("fio-jobs/fetch/4"));
  EXPECT_FALSE(seen.contains("fio-jobs/store/1"));
  // Stores of a tenant at its SSD quota (each evicts the tenant's own chunks first).
  EXPECT_TRUE(seen.contains("kvcache-t2-quota/store/1"));
  EXPECT_TRUE(seen.contains("kvcache-t2-quota/store/4"));
  // It stores only: its stores evict the chunks a fetch would read.
  EXPECT_FALSE(seen.contains("kvcache-t2-quota/fetch/1"));
}

TEST(KvbenchTest, ServiceJsonHasEveryCase) {
  TempDir dir;
  auto r = RunProgram(kKvbench, {"service", "--dir", dir.File("scratch"), "--seconds", "0.2",
                                 "--reps", "1", "--clients", "2", "--config",
                                 std::string(KVC_SOURCE_DIR) + "/configs/mini.json", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  std::set<std::string> seen;
  for (const auto& c : j["cases"]) {
    if (c["op"] == "call") {  // no payload: only latency
      EXPECT_GT(c["p50_us"].get<double>(), 0) << c.dump();
    } else {
      EXPECT_GT(c["gbps"].get<double>(), 0) << c.dump();
    }
    EXPECT_EQ(c["clients"].get<int>(), 2);
    seen.insert(c["system"].get<std::string>() + "/" + c["op"].get<std::string>());
  }
  EXPECT_EQ(seen,
            (std::set<std::string>{"kvcache-grpc/fetch", "kvcache-grpc/store", "kvcache-shm/fetch",
                                   "python-grpc/fetch", "python-grpcio/fetch", "python-shm/fetch",
                                   "sglang-grpc/fetch", "sglang-shm/fetch", "vllm-grpc/fetch",
                                   "redis/fetch", "redis/store", "memcpy/fetch", "memcpy/store",
                                   "kvcache-grpc/call", "redis/call"}));
}

TEST(KvbenchTest, ClusterJsonComparesTheClusterWithOneNode) {
  TempDir dir;
  auto r = RunProgram(kKvbench, {"cluster", "--dir", dir.File("scratch"), "--seconds", "0.2",
                                 "--reps", "1", "--clients", "2", "--resume-tokens", "4096",
                                 "--lookup-tokens", "8192", "--repair-chunks", "256", "--config",
                                 std::string(KVC_SOURCE_DIR) + "/configs/mini.json", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["systems"].size(), 2u) << r.out;
  EXPECT_EQ(j["systems"][0]["system"], "single");
  EXPECT_EQ(j["systems"][0]["resume_from_ssd"]["chunks"].get<int>(), 4096 / 256);
  EXPECT_GT(j["systems"][0]["resume_from_ssd"]["lookup_and_fetch_ms"].get<double>(), 0);
  const nlohmann::json& c = j["systems"][1];
  EXPECT_EQ(c["system"], "cluster-3");
  EXPECT_GT(c["prefix_fetch"][0]["gbps"].get<double>(), 0);
  EXPECT_GT(c["prefix_fetch"][0]["vs_single"].get<double>(), 0);
  EXPECT_EQ(c["resume"]["chunks"].get<int>(), 4096 / 256);
  EXPECT_EQ(c["lookup"]["chunks"].get<int>(), 8192 / 256);
  EXPECT_GT(c["lookup"]["p99_ms"].get<double>(), 0);
  ASSERT_EQ(c["store"].size(), 2u);
  EXPECT_EQ(c["store"][1]["replicas"].get<int>(), 2);
  EXPECT_GT(c["store"][1]["vs_r1"].get<double>(), 0);
  // The loss of a node, repaired without reads (kvbench checks every prefix afterwards).
  const nlohmann::json& rp = j["repair"];
  EXPECT_EQ(rp["system"], "cluster-3");
  EXPECT_EQ(rp["stored_chunks"].get<int>(), 256);
  EXPECT_GT(rp["killed_node_chunks"].get<int>(), 0) << rp.dump();
  EXPECT_GT(rp["copied_bytes"].get<double>(), 0) << rp.dump();
  EXPECT_GT(rp["repair_s"].get<double>(), rp["detect_s"].get<double>() - 1);
  // Lookup by ranking at simulated fleet sizes: R + k nodes per key, not every member.
  ASSERT_FALSE(j["lookup_fanout"].empty());
  for (const auto& f : j["lookup_fanout"]) {
    const int members = f["members"], chunks = f["chunks"], per_key = f["nodes_per_key"];
    EXPECT_GT(per_key, 2) << "R = 2 and at least one extra node";
    EXPECT_EQ(f["keys_asked"].get<int>(), chunks * std::min(members, per_key)) << f.dump();
    EXPECT_EQ(f["keys_asked_every_member"].get<int>(), chunks * members) << f.dump();
    EXPECT_LE(f["calls"].get<int>(), members);
  }
}

// The soak as CI runs it: short, but with SIGKILLs, SSD faults, dropped streams and a
// hostile tenant; it must lose nothing acknowledged and serve nothing wrong.
TEST(KvbenchTest, ASoakUnderFaultsLosesNothingAndServesNothingWrong) {
  TempDir dir;
  auto r = RunProgram(kKvbench, {"soak", "--dir", dir.File("soak"), "--seconds", "8", "--clients",
                                 "3", "--kill-every", "2.5", "--io-fault-rate", "200",
                                 "--ssd-bytes", std::to_string(256 << 20), "--config",
                                 std::string(KVC_SOURCE_DIR) + "/configs/mini.json", "--json"});
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out << r.err;
  std::printf("%s\n", j.dump().c_str());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(j["passed"].get<bool>());
  EXPECT_EQ(j["lost"].get<int>(), 0);
  EXPECT_EQ(j["wrong_bytes"].get<int>(), 0);
  EXPECT_EQ(j["cross_tenant_hits"].get<int>(), 0);
  EXPECT_GE(j["restarts"].get<int>(), 1);
  EXPECT_GT(j["durable_acknowledgements"].get<int>(), 0);
  EXPECT_GT(j["fetched_chunks"].get<int>(), 0);
  EXPECT_GT(j["hostile_calls"].get<int>(), 0);
  EXPECT_GT(j["chunks_verified_at_end"].get<int>(), 0);
}

// The shared tier on a real single-host Ceph cluster, beside `rados bench` in the same run:
// every side moved bytes, and the ratios are there.
TEST(KvbenchTest, RadosBenchRunsBesideRadosBench) {
  TempDir dir;
  auto r = RunProgram(kKvbench, {"rados", "--dir", dir.File("rados"), "--bytes", "30000000",
                                 "--reps", "1", "--depth", "8", "--json"});
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(j["chunk_bytes"].get<uint64_t>(), 0u) << "the default config's chunk";
  for (const char* f : {"rados_bench_write_mbps", "rados_bench_read_mbps", "tier_write_mbps",
                        "tier_read_mbps", "store_fetch_mbps", "write_vs_rados_bench",
                        "read_vs_rados_bench", "store_fetch_vs_rados_bench"})
    EXPECT_GT(j[f].get<double>(), 0) << f;
  EXPECT_EQ(j["runs"][0]["chunks"].get<uint64_t>(), j["objects"].get<uint64_t>());
}

// A crashed daemon restarted on its folder finds every chunk it held, each time (the run
// fails otherwise), and the report has each count's times and the index-read floor.
TEST(KvbenchTest, RestartFindsEveryChunkAfterEachCrash) {
  TempDir dir;
  auto r = RunProgram(kKvbench, {"restart", "--dir", dir.File("restart"), "--chunks", "500,3000",
                                 "--reps", "2", "--json"});
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(j["counts"].size(), 2u);
  for (const auto& c : j["counts"]) {
    EXPECT_EQ(c["records"].get<uint64_t>(), c["chunks"].get<uint64_t>());
    EXPECT_EQ(c["runs"].size(), 2u);
    for (const char* field :
         {"crash_listening_s", "crash_first_hit_s", "listening_s", "first_hit_s", "index_read_s"}) {
      EXPECT_GT(c[field].get<double>(), 0) << field;
    }
    EXPECT_GE(c["first_hit_s"].get<double>(), c["listening_s"].get<double>());
  }
}

// On a store made as kvcached makes it by default, a small chunk is charged its own pages
// in RAM (about 1 byte per payload byte) and the slot of its size class on SSD, and a size past the
// largest chunk is refused, naming the limit.
TEST(KvbenchTest, FootprintShowsWhatEachSizeIsCharged) {
  TempDir dir;
  auto r = RunProgram(
      kKvbench,
      {"footprint", "--dir", dir.File("fp"), "--chunks", "4", "--chunk-bytes",
       "4096,200000,1048576", "--max-chunk-bytes", "200000", "--config",
       std::string(KVC_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.config.json", "--json"});
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(j["sizes"].size(), 3u);
  const nlohmann::json& small = j["sizes"][0];
  EXPECT_EQ(small["ram_chunks"].get<uint64_t>(), 4u);
  EXPECT_DOUBLE_EQ(small["ram_charged_per_payload_byte"].get<double>(), 1.0);
  // One slot each of its own size class: a header and the payload in 4 KiB pages (2 pages
  // for 4,096 bytes), not the first class's reference-size slot.
  EXPECT_DOUBLE_EQ(small["ssd_charged_per_payload_byte"].get<double>(), 2.0);
  EXPECT_LT(j["sizes"][1]["ssd_charged_per_payload_byte"].get<double>(), 1.03);
  ASSERT_TRUE(j["sizes"][2].contains("refused"));
  EXPECT_NE(j["sizes"][2]["refused"].get<std::string>().find("200000"), std::string::npos);
}

TEST(KvbenchTest, EngineJsonHasEveryCase) {
  auto r = RunProgram(
      kKvbench, {"engine", "--config", std::string(KVC_SOURCE_DIR) + "/configs/mini.json",
                 "--prefill-tokens", "256,512", "--full-depth-max", "256", "--decode-tokens", "4",
                 "--resume-prefix", "256", "--resume-new", "64", "--reps", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["prefill"].size(), 2u);
  EXPECT_GT(j["prefill"][0]["ced_tok_s"].get<double>(), 0);
  EXPECT_TRUE(j["prefill"][0].contains("ced_over_full"));
  EXPECT_FALSE(j["prefill"][1].contains("ced_over_full"));  // above --full-depth-max
  EXPECT_GT(j["decode"]["plain_tok_s"].get<double>(), 0);
  EXPECT_TRUE(j["decode"].contains("dspark_acceptance"));
  EXPECT_GT(j["resume"]["speedup_exact"].get<double>(), 0);
  EXPECT_EQ(j["gemm"].size(), 4u);
}

// --contexts: only the sweep, prefill then decode at each length.
TEST(KvbenchTest, EngineContextSweepReportsPrefillAndDecodeAtEachLength) {
  auto r = RunProgram(kKvbench,
                      {"engine", "--config", std::string(KVC_SOURCE_DIR) + "/configs/tiny.json",
                       "--contexts", "96,200", "--decode-tokens", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["contexts"].size(), 2u) << r.out;
  EXPECT_EQ(j["contexts"][1]["tokens"].get<int64_t>(), 200);
  for (const auto& c : j["contexts"]) {
    EXPECT_GT(c["prefill_tok_s"].get<double>(), 0) << c.dump();
    EXPECT_GT(c["decode_tok_s"].get<double>(), 0) << c.dump();
  }
  EXPECT_FALSE(j.contains("prefill"));  // the other cases do not run
  auto text = RunProgram(kKvbench,
                         {"engine", "--config", std::string(KVC_SOURCE_DIR) + "/configs/tiny.json",
                          "--contexts", "96", "--decode-tokens", "2"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("decode tok/s"), std::string::npos) << text.out;
}

// The shipped trained model on one held-out document of the corpus: every mode measured,
// exact resume bit-identical to CED, a replay that covers the whole prefix too, the
// approximations not.
TEST(KvbenchTest, QualityMeasuresEveryResumeModeOnTheTrainedModel) {
  std::ifstream config_file(std::string(KVC_SOURCE_DIR) + "/configs/small.json");
  const nlohmann::json config = nlohmann::json::parse(config_file)["text_config"];
  const int64_t window = config["sliding_window"].get<int64_t>();
  const size_t block = config["dspark_block_size"].get<size_t>();
  const std::string w = std::to_string(window);
  auto r = RunProgram(kKvbench, {"quality",
                                 "--weights",
                                 "replay-aware=" + std::string(KVC_SOURCE_DIR) +
                                     "/train/weights/small-replay.safetensors",
                                 "--documents",
                                 "1",
                                 "--points",
                                 "1",
                                 "--steps",
                                 "12",
                                 "--windows",
                                 "0," + w + ",100000",
                                 "--max-prompt-tokens",
                                 "800",
                                 "--dspark-prompts",
                                 "1",
                                 "--dspark-steps",
                                 "24",
                                 "--decode-contexts",
                                 "600",
                                 "--decode-tokens",
                                 "4",
                                 "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const nlohmann::json& v = j["variants"]["replay-aware"];
  ASSERT_EQ(v["cases"].get<int64_t>(), 1) << r.out;
  const double bpb = v["held_out_bits_per_byte"].get<double>();
  EXPECT_GT(bpb, 0.05) << "a trained model, not a memorized text";
  EXPECT_LT(bpb, 4.0) << "random weights would be ~9 bits/byte";
  const nlohmann::json& modes = v["modes"];
  EXPECT_TRUE(modes["exact_vs_ced"]["bit_identical"].get<bool>()) << modes.dump();
  EXPECT_EQ(modes["exact_vs_ced"]["kl_mean"].get<double>(), 0.0);
  EXPECT_TRUE(modes["bounded_100000_vs_ced"]["bit_identical"].get<bool>())
      << "replaying every cached token is a cold CED prefill";
  EXPECT_FALSE(modes["bounded_" + w + "_vs_full"]["bit_identical"].get<bool>());
  EXPECT_FALSE(modes["ced_vs_full"]["bit_identical"].get<bool>());
  for (const std::string& m : {std::string("ced_vs_full"), std::string("bounded_0_vs_full"),
                               "bounded_" + w + "_vs_full"}) {
    EXPECT_GT(modes[m]["kl_mean"].get<double>(), 0.0) << m;
    EXPECT_LT(modes[m]["kl_mean"].get<double>(), 0.5) << m;
    EXPECT_GE(modes[m]["agreement"].get<double>(), 0.0) << m;
  }
  // The model's rule replays one window (the default new tokens are a window, so no more).
  EXPECT_EQ(modes["bounded_" + w + "_vs_full"]["replayed_tokens"].get<double>(),
            static_cast<double>(window));
  const nlohmann::json& d = v["dspark"];
  ASSERT_EQ(d["acceptance_by_depth"].size(), block) << d.dump();
  for (size_t k = 1; k < d["acceptance_by_depth"].size(); ++k)
    EXPECT_LE(d["acceptance_by_depth"][k].get<double>(),
              d["acceptance_by_depth"][k - 1].get<double>());
  EXPECT_GT(d["verify_ms"].get<double>(), 0.0);
  EXPECT_GT(d["speedup"].get<double>(), 0.0);
  // On the document's own text: probes along it, acceptance falling with depth.
  const nlohmann::json& t = d["on_text"];
  EXPECT_GT(t["probes"].get<int64_t>(), 0) << t.dump();
  ASSERT_EQ(t["acceptance_by_depth"].size(), block) << t.dump();
  for (size_t k = 1; k < block; ++k)
    EXPECT_LE(t["acceptance_by_depth"][k].get<double>(),
              t["acceptance_by_depth"][k - 1].get<double>());
  EXPECT_NEAR(t["tokens_per_main_pass"].get<double>(),
              1.0 + t["acceptance"].get<double>() * static_cast<double>(block), 1e-9);
  ASSERT_EQ(j["decode_cost"]["rows"].size(), 1u);
  const nlohmann::json& row = j["decode_cost"]["rows"][0];
  EXPECT_GT(row["indexer_ms"].get<double>(), 0.0) << row.dump();
  EXPECT_GT(row["attention_ms"].get<double>(), 0.0) << row.dump();
  EXPECT_LE(row["attention_ms"].get<double>() + row["indexer_ms"].get<double>() +
                row["dense_ms"].get<double>() + row["experts_ms"].get<double>(),
            row["ms_per_token"].get<double>() * 1.01);
  auto bad = RunProgram(kKvbench, {"quality", "--weights", "nameless"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("is not NAME=FILE"), std::string::npos) << bad.err;
}

// A quick `kvbench quality` (the shipped small-plain weights, one resume point per document,
// a few tokens) with `args` added; its JSON, or a discarded value.
nlohmann::json QuickQuality(std::vector<std::string> args) {
  std::vector<std::string> all = {
      "quality",
      "--weights",
      "plain=" + std::string(KVC_SOURCE_DIR) + "/train/weights/small-plain.safetensors",
      "--points",
      "1",
      "--steps",
      "4",
      "--greedy-steps",
      "2",
      "--windows",
      "128",
      "--max-prompt-tokens",
      "600",
      "--dspark-prompts",
      "0",
      "--dspark-probes",
      "1",
      "--bootstrap",
      "10",
      "--json"};
  all.insert(all.end(), args.begin(), args.end());
  auto r = RunProgram(kKvbench, all);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out, nullptr, false);
}

// The corpus keeps man pages gzipped (as Debian ships them): a gzipped document reads as its
// text — the same figures as the plain file, a file of two gzip members too — and a truncated
// one is refused by name, never measured.
TEST(KvbenchTest, QualityReadsGzippedDocumentsAsTheirText) {
  TempDir dir;
  std::ifstream src(std::string(KVC_SOURCE_DIR) + "/bench/kvbench/quality_bench.cc");
  const std::string text((std::istreambuf_iterator<char>(src)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 4000u);
  const std::string half = dir.File("a.txt"), rest = dir.File("b.txt"), whole = dir.File("doc.txt");
  std::ofstream(half) << text.substr(0, text.size() / 2);
  std::ofstream(rest) << text.substr(text.size() / 2);
  std::ofstream(whole) << text;
  for (const std::string& f : {half, rest, whole}) {
    ASSERT_EQ(RunProgram("/bin/gzip", {"-k", f}).exit_code, 0) << f;
  }
  auto slurp = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string two = dir.File("two-members.txt.gz"), cut = dir.File("cut.txt.gz");
  std::ofstream(two, std::ios::binary) << slurp(half + ".gz") << slurp(rest + ".gz");
  const std::string gz = slurp(whole + ".gz");
  std::ofstream(cut, std::ios::binary) << gz.substr(0, gz.size() / 2);
  auto bits = [](const std::string& doc) {
    const nlohmann::json j = QuickQuality({"--held-out", doc, "--documents", "1"});
    return j.is_discarded() ? -1.0 : j["variants"]["plain"]["held_out_bits_per_byte"].get<double>();
  };
  const double plain = bits(whole);
  EXPECT_GT(plain, 0.05);
  EXPECT_EQ(bits(whole + ".gz"), plain);
  EXPECT_EQ(bits(two), plain);
  auto bad = RunProgram(kKvbench, {"quality", "--held-out", cut, "--json"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("cut.txt.gz is not valid gzip"), std::string::npos) << bad.err;
}

// A manifest names each file's SHA-256 (of the file as stored): a held-out file whose bytes
// changed — even to the same size, so the text's length still matches — is refused by name,
// never measured; the unchanged file under the same manifest entry is measured.
TEST(KvbenchTest, QualityRefusesAHeldOutFileWhoseDigestChanged) {
  TempDir dir;
  const std::string original = std::string(KVC_SOURCE_DIR) + "/bench/kvbench/quality_bench.cc";
  std::ifstream src(original, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(src)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 4000u);
  const std::string doc = dir.File("doc.txt"), manifest = dir.File("manifest.json");
  std::ofstream(doc, std::ios::binary) << bytes;
  auto sum = RunProgram("/usr/bin/sha256sum", {doc});
  ASSERT_EQ(sum.exit_code, 0) << sum.err;
  const std::string sha = sum.out.substr(0, 64);
  std::ofstream(manifest) << nlohmann::json{
      {"files",
       {{{"path", doc}, {"bytes", bytes.size()}, {"sha256", sha}, {"split", "held_out"}}}}};
  const nlohmann::json ok = QuickQuality({"--manifest", manifest, "--documents", "1"});
  ASSERT_FALSE(ok.is_discarded());
  EXPECT_EQ(ok["documents"], nlohmann::json::array({doc}));

  bytes[bytes.size() / 2] ^= 0x20;  // one byte changed, the size kept
  std::ofstream(doc, std::ios::binary) << bytes;
  auto changed = RunProgram(kKvbench, {"quality", "--manifest", manifest, "--json"});
  EXPECT_NE(changed.exit_code, 0);
  EXPECT_NE(changed.err.find("held-out file " + doc + " has SHA-256"), std::string::npos)
      << changed.err;
  EXPECT_NE(changed.err.find("says " + sha + " (the corpus changed)"), std::string::npos)
      << changed.err;
}

// --shuffle draws the documents as a seeded sample of the whole held-out split (corpus v2: its
// gzipped man pages among them), the same for the same seed; 0 keeps the first by path.
TEST(KvbenchTest, QualityShuffleSamplesTheSplitReproducibly) {
  static constexpr size_t kDocuments = 5;  // of the split's hundreds: a sample, not all of it
  auto documents = [](const std::string& shuffle) {
    const nlohmann::json j =
        QuickQuality({"--manifest", std::string(KVC_SOURCE_DIR) + "/train/corpus-v2.json",
                      "--shuffle", shuffle, "--documents", std::to_string(kDocuments)});
    std::vector<std::string> docs;
    if (!j.is_discarded()) docs = j["documents"].get<std::vector<std::string>>();
    EXPECT_EQ(docs.size(), kDocuments) << j.dump();
    return docs;
  };
  const std::vector<std::string> first = documents("0"), a = documents("7"), b = documents("8");
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end()));
  EXPECT_NE(a, first);
  EXPECT_NE(a, b);
  EXPECT_EQ(documents("7"), a);
  std::set<std::string> tops;  // a sample across the split reaches beyond one directory
  for (const auto& d : a) tops.insert(d.substr(0, d.find('/', 5)));
  EXPECT_GE(tops.size(), 2u) << ::testing::PrintToString(a);
}

// --jobs runs the cases on several threads (one Model, a Sequence each, the engine's pool
// shared): every figure is the same as on one thread, only the timings differ.
TEST(KvbenchTest, QualityJobsGiveTheSameFiguresAsOneThread) {
  auto figures = [](const std::string& jobs) {
    nlohmann::json j =
        QuickQuality({"--manifest", std::string(KVC_SOURCE_DIR) + "/train/corpus-v2.json",
                      "--shuffle", "3", "--documents", "6", "--jobs", jobs});
    if (j.is_discarded()) return j;
    EXPECT_EQ(j["variants"]["plain"]["jobs"], std::stoi(jobs));
    EXPECT_EQ(j["variants"]["plain"]["cases"], 6) << j.dump();
    j["variants"]["plain"].erase("seconds");
    j["variants"]["plain"].erase("jobs");
    j["variants"]["plain"].erase("dspark");  // timed
    return j;
  };
  const nlohmann::json one = figures("1"), three = figures("3");
  ASSERT_FALSE(one.is_discarded());
  EXPECT_GT(one["variants"]["plain"]["modes"]["ced_vs_full"]["kl_mean"].get<double>(), 0);
  EXPECT_EQ(one, three);
}

// Without --weights, kvbench quality loads the shipped twins that fit --config: the small
// pair for configs/small.json, the 40-layer pair for configs/small-deep.json (so each table in
// docs/quality.md is one command), and a config without a pair is refused by name.
TEST(KvbenchTest, QualityDefaultsToTheTwinsOfItsConfig) {
  const std::string src = KVC_SOURCE_DIR;
  for (const auto& [config, stem] : std::vector<std::pair<std::string, std::string>>{
           {"small.json", "small-v2"}, {"small-deep.json", "small-deep-v2"}}) {
    auto r = RunProgram(kKvbench, {"quality",
                                   "--config",
                                   src + "/configs/" + config,
                                   "--documents",
                                   "1",
                                   "--points",
                                   "1",
                                   "--steps",
                                   "8",
                                   "--greedy-steps",
                                   "8",
                                   "--windows",
                                   "128",
                                   "--max-prompt-tokens",
                                   "400",
                                   "--dspark-prompts",
                                   "0",
                                   "--dspark-probes",
                                   "1",
                                   "--bootstrap",
                                   "100",
                                   "--json"});
    ASSERT_EQ(r.exit_code, 0) << config << ": " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j["variants"]["plain"]["weights"],
              src + "/train/weights/" + stem + "-plain.safetensors");
    EXPECT_EQ(j["variants"]["replay-aware"]["weights"],
              src + "/train/weights/" + stem + "-replay.safetensors");
    EXPECT_EQ(j["variants"]["plain"]["cases"], 1) << config;
  }
  // A config with no shipped pair is refused by name, not run on another config's weights.
  auto none = RunProgram(kKvbench, {"quality", "--config", src + "/configs/mini.json"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("mini.json"), std::string::npos) << none.err;
  EXPECT_NE(none.err.find("--weights"), std::string::npos) << none.err;
}

// The intervals: with several documents the harness tells no replay (W = 0) from two windows
// of it (W = 256) at 95 % — the paired interval of their KL difference excludes 0 — while
// exact replay's interval is exactly [0, 0]; every interval holds its mean; the repeated
// case is bit-identical; the first-divergence histogram counts every case.
TEST(KvbenchTest, QualityIntervalsSeparateNoReplayFromTwoWindows) {
  auto r = RunProgram(
      kKvbench, {"quality",
                 "--weights",
                 "plain=" + std::string(KVC_SOURCE_DIR) + "/train/weights/small-plain.safetensors",
                 "--documents",
                 "6",
                 "--points",
                 "2",
                 "--steps",
                 "8",
                 "--greedy-steps",
                 "24",
                 "--windows",
                 "0,128,256",
                 "--max-prompt-tokens",
                 "700",
                 "--dspark-prompts",
                 "0",
                 "--bootstrap",
                 "500",
                 "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const nlohmann::json& v = j["variants"]["plain"];
  ASSERT_GE(v["cases"].get<int64_t>(), 10) << r.out;
  const nlohmann::json& sep = v["separation"];
  EXPECT_EQ(sep["windows"], nlohmann::json({0, 256}));
  EXPECT_TRUE(sep["separated"].get<bool>()) << sep.dump();
  EXPECT_GT(sep["ci95"][0].get<double>(), 0.0) << "no replay diverges more than two windows";
  EXPECT_TRUE(v["run_to_run"]["bit_identical"].get<bool>());
  for (const auto& [mode, m] : v["modes"].items()) {
    for (const char* key :
         {"kl_mean", "kl_steps_mean", "agreement", "greedy_identity", "loss_diff_bits"}) {
      const double mean = m[key].get<double>(), lo = m[std::string(key) + "_ci95"][0],
                   hi = m[std::string(key) + "_ci95"][1];
      EXPECT_LE(lo, mean + 1e-12) << mode << " " << key;
      EXPECT_GE(hi, mean - 1e-12) << mode << " " << key;
    }
    int64_t counted = 0;
    for (const auto& [range, n] : m["first_divergence"]["histogram"].items())
      counted += n.get<int64_t>();
    EXPECT_EQ(counted, v["cases"].get<int64_t>()) << mode;
  }
  const nlohmann::json& exact = v["modes"]["exact_vs_ced"];
  EXPECT_EQ(exact["kl_mean_ci95"], nlohmann::json({0.0, 0.0}));
  EXPECT_EQ(exact["greedy_identity"].get<double>(), 1.0);
  EXPECT_EQ(exact["first_divergence"]["histogram"]["never"], v["cases"]);
  EXPECT_LT(v["modes"]["bounded_0_vs_full"]["greedy_identity"].get<double>(), 1.0);
  EXPECT_EQ(j["sglang_kl_bar"].get<double>(), 0.01);
}

// kvbench e2e on small cases (a 512-token prefix, one sweep case), plus `extra` flags.
testing::ProcessResult RunSmallE2e(const TempDir& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"e2e",
                                   "--dir",
                                   dir.File("scratch"),
                                   "--config",
                                   std::string(KVC_SOURCE_DIR) + "/configs/mini.json",
                                   "--prefix-tokens",
                                   "512",
                                   "--new-tokens",
                                   "64",
                                   "--new-token-sweep",
                                   "32",
                                   "--sweep-prefix",
                                   "256",
                                   "--reps",
                                   "1",
                                   "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return RunProgram(kKvbench, args);
}

TEST(KvbenchTest, E2eJsonHasEveryCase) {
  TempDir dir;
  auto r = RunSmallE2e(dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  std::set<std::string> tiers;
  for (const auto& c : j["cases"]) {
    tiers.insert(c["tier"].get<std::string>());
    EXPECT_GT(c["reused_tokens"].get<int>(), 0) << c.dump();
    EXPECT_GT(c["ttft_cold_ms"].get<double>(), 0);
    EXPECT_GT(c["ttft_warm_ms"].get<double>(), 0);
  }
  EXPECT_EQ(j["cases"].size(), 3u);  // the prefix from RAM and from SSD, one sweep case
  EXPECT_EQ(tiers, (std::set<std::string>{"ram", "ssd"}));
}

// With --rados each prefix is also resumed after kvcached is killed and its folder deleted:
// the whole prefix comes from RADOS.
TEST(KvbenchTest, E2eResumesAPrefixFromRadosAfterTheNodeIsLost) {
  TempDir dir;
  auto r = RunSmallE2e(dir, {"--rados"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["cases"].size(), 4u);  // RAM, SSD, RADOS, one sweep case
  const nlohmann::json& from_rados = j["cases"][2];
  EXPECT_EQ(from_rados["tier"], "rados");
  EXPECT_EQ(from_rados["reused_tokens"].get<int>(), j["cases"][1]["reused_tokens"].get<int>());
  EXPECT_GT(from_rados["reused_tokens"].get<int>(), 0);
}

// On a machine with a GPU: small cases, every field, our GEMM batch invariant. Without
// one (or in a build without CUDA): one clear line and exit code 1.
TEST(KvbenchTest, KernelsRunOnAGpuOrSayWhyNot) {
  auto r = RunProgram(kKvbench,
                      {"kernels", "--contexts", "65536", "--batches", "1,4", "--indexer-contexts",
                       "8192,65536", "--upload-mib", "32", "--reps", "2", "--json"});
  if (r.exit_code != 0) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("CUDA"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    GTEST_SKIP() << "no GPU here: " << r.err;
  }
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_GT(j["copy_gbps"].get<double>(), 0);
  ASSERT_EQ(j["attention"].size(), 2u);
  for (const auto& a : j["attention"]) EXPECT_GT(a["tiled_over_copy"].get<double>(), 0) << a;
  ASSERT_EQ(j["indexer"].size(), 2u);
  EXPECT_GT(j["upload"]["pages_over_pinned"].get<double>(), 0);
  for (const auto& g : j["gemm"]) EXPECT_TRUE(g["ours_rows_batch_invariant"].get<bool>()) << g;
}

TEST(KvbenchTest, BadFlagsFailWithOneLine) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"storage"},
                                               {"storage", "--dir", "/tmp/x", "--ops", "delete"},
                                               {"storage", "--dir", "/tmp/x", "--seconds", "-1"},
                                               {"frobnicate"}}) {
    auto r = RunProgram(kKvbench, args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("kvbench: error:"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace kvc
