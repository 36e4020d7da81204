// wire/ against tests/wire/wire_vectors.json (protobuf's own encodings), and its refusals.
#include "wire/wire.h"

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvc::wire {
namespace {

nlohmann::json Vectors() {
  std::ifstream in(std::string(KVC_SOURCE_DIR) + "/tests/wire/wire_vectors.json");
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

std::string Bytes(const nlohmann::json& hex) {
  return absl::HexStringToBytes(hex.get<std::string>());
}

ChunkKey Key(const nlohmann::json& hex) { return *KeyFrom(Bytes(hex)); }

std::span<const uint8_t> Span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(WireTest, KeysAndPackedKeysAreTheVectorsBytes) {
  const nlohmann::json v = Vectors();
  std::vector<ChunkKey> keys;
  for (const auto& k : v["keys"]) {
    keys.push_back(Key(k));
    EXPECT_EQ(KeyBytes(keys.back()), Bytes(k));
  }
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(PackKeys(keys), Bytes(v["packed"]));
  absl::StatusOr<std::vector<ChunkKey>> back = UnpackKeys(Bytes(v["packed"]), 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, keys);
}

TEST(WireTest, TheFetchFrameIsProtobufsEncoding) {
  const nlohmann::json v = Vectors();
  for (const auto& f : v["fetch"]) {
    const uint64_t n = f["payload_bytes"].get<uint64_t>();
    const std::string header = FetchResponseHeader(Key(f["key"]), n);
    EXPECT_EQ(header, Bytes(f["header"])) << n << "-byte payload";
    std::string message = header + std::string(n, '\x5a');
    absl::StatusOr<FetchFrame> split = SplitFetchResponse(Span(message));
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ(split->key, Bytes(f["key"]));
    EXPECT_EQ(split->payload.size(), n);
    EXPECT_EQ(split->payload.data(), Span(message).data() + header.size()) << "a view, no copy";
  }
  for (const auto& f : v["fetch_other_encodings"]) {
    const std::string message = Bytes(f["message"]);
    absl::StatusOr<FetchFrame> split = SplitFetchResponse(Span(message));
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ(split->key, Bytes(f["key"]));
    EXPECT_EQ(std::string(split->payload.begin(), split->payload.end()), Bytes(f["payload"]));
  }
}

TEST(WireTest, BadBytesAreRefusedWithWhatWasWrong) {
  absl::StatusOr<ChunkKey> k = KeyFrom(std::string(15, 'x'), "parent_key");
  EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(k.status().message(), "parent_key is 15 bytes; keys are 16 bytes");
  absl::StatusOr<std::vector<ChunkKey>> p = UnpackKeys(std::string(33, 'x'), 10);
  EXPECT_NE(p.status().message().find("33 bytes, not a whole number"), std::string::npos);
  p = UnpackKeys(std::string(48, 'x'), 2);
  EXPECT_NE(p.status().message().find("3 chunk keys in one call; the limit is 2"),
            std::string::npos);
  const std::string truncated = FetchResponseHeader(ChunkKey{}, 100) + std::string(99, 'y');
  absl::StatusOr<FetchFrame> f = SplitFetchResponse(Span(truncated));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("field 2 (100 bytes at byte 20) runs past the message (119"),
            std::string::npos)
      << f.status();
  const std::string varint_field = std::string("\x08\x01", 2);
  f = SplitFetchResponse(Span(varint_field));
  EXPECT_NE(f.status().message().find("field 1 has wire type 0"), std::string::npos);
}

}  // namespace
}  // namespace kvc::wire
