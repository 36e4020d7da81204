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

// What a client splits a FetchResponse into (SplitFetchResponsePieces): the key's field,
// and the payload as views into the message.
StoreFrame SplitWhole(const std::string& message) {
  const std::span<const uint8_t> whole = Span(message);
  StoreFrame frame;
  const absl::Status s = SplitFetchResponsePieces(std::span(&whole, 1), &frame);
  EXPECT_TRUE(s.ok()) << s;
  return frame;
}

std::string KeyField(const nlohmann::json& key) { return std::string("\x0a\x10", 2) + Bytes(key); }

std::string Joined(const StoreFrame& f) {
  std::string out;
  for (std::span<const uint8_t> p : f.payload) out.append(p.begin(), p.end());
  return out;
}

TEST(WireTest, TheFetchFrameIsProtobufsEncoding) {
  const nlohmann::json v = Vectors();
  for (const auto& f : v["fetch"]) {
    const uint64_t n = f["payload_bytes"].get<uint64_t>();
    const std::string header = FetchResponseHeader(Key(f["key"]), n);
    EXPECT_EQ(header, Bytes(f["header"])) << n << "-byte payload";
    std::string message = header + std::string(n, '\x5a');
    const StoreFrame split = SplitWhole(message);
    EXPECT_EQ(split.rest, KeyField(f["key"]));
    EXPECT_EQ(split.payload_bytes, n);
    EXPECT_EQ(Joined(split), std::string(n, '\x5a'));
    if (n > 0) {
      ASSERT_EQ(split.payload.size(), 1u);
      EXPECT_EQ(split.payload[0].data(), Span(message).data() + header.size()) << "a view, no copy";
    }
  }
  for (const auto& f : v["fetch_other_encodings"]) {
    const std::string message = Bytes(f["message"]);  // the payload's views point into it
    const StoreFrame split = SplitWhole(message);
    // The key's field first (unknown fields after it stay, for protobuf to skip).
    EXPECT_EQ(split.rest.substr(0, 18), KeyField(f["key"]));
    EXPECT_EQ(Joined(split), Bytes(f["payload"]));
    // A client without protobuf finds the key past the unknown fields.
    absl::StatusOr<std::string> key = FetchResponseKeyField(split.rest);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ(*key, Bytes(f["key"]));
  }
  for (const auto& f : v["fetch"]) {
    const StoreFrame split = SplitWhole(FetchResponseHeader(Key(f["key"]), 3) + "abc");
    EXPECT_EQ(FetchResponseKeyField(split.rest).value_or("?"), Bytes(f["key"]));
  }
  // The last key field is the key, as for protobuf; none: empty; no protobuf: refused.
  const std::string two_keys = KeyField(v["fetch"][0]["key"]) + std::string("\x0a\x03xyz", 5);
  EXPECT_EQ(FetchResponseKeyField(two_keys).value_or("?"), "xyz");
  EXPECT_EQ(FetchResponseKeyField(std::string("\x08\x01", 2)).value_or("?"), "");
  absl::StatusOr<std::string> bad =
      FetchResponseKeyField(std::string("\x0a\x10"
                                        "abc",
                                        5));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("field 1 running past the end at byte 0"),
            std::string::npos)
      << bad.status();
}

// What both Fetch readers (the C++ client, the Python package's native fetch) accept.
TEST(WireTest, AFetchAnswerIsCheckedAgainstWhatWasAsked) {
  const nlohmann::json v = Vectors();
  const ChunkKey key = Key(v["fetch"][0]["key"]), other{};
  const std::string good = FetchResponseHeader(key, 5) + "abcde";
  const std::span<const uint8_t> piece = Span(good);
  StoreFrame f;
  EXPECT_TRUE(CheckFetchAnswer(std::span(&piece, 1), key.bytes.data(), 5, &f).ok());
  EXPECT_EQ(Joined(f), "abcde");
  auto why = [&](const ChunkKey* want, uint64_t bytes, const std::string& message) {
    const std::span<const uint8_t> p = Span(message);
    const absl::Status s =
        CheckFetchAnswer(std::span(&p, 1), want ? want->bytes.data() : nullptr, bytes, &f);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    return std::string(s.message());
  };
  EXPECT_EQ(why(&other, 5, good), "another chunk than asked for");
  EXPECT_EQ(why(&key, 6, good), "a payload of 5 bytes; this namespace's chunks are 6");
  EXPECT_EQ(why(nullptr, 5, good), "an answer past the last chunk asked for");
  EXPECT_NE(why(&key, 5, good.substr(0, 10)).find("not a FetchResponse"), std::string::npos);
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
  const std::span<const uint8_t> whole = Span(truncated);
  StoreFrame f;
  absl::Status s = SplitFetchResponsePieces(std::span(&whole, 1), &f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);  // a client reports DataLoss
  EXPECT_NE(s.message().find("field 2 running past the end at byte 18"), std::string::npos) << s;
  // A field of another wire type is protobuf, and stays in `rest`: the client's parse of
  // the key's fields refuses it ("the key does not parse").
  const std::string varint_field = std::string("\x08\x01", 2);
  const std::span<const uint8_t> varint = Span(varint_field);
  ASSERT_TRUE(SplitFetchResponsePieces(std::span(&varint, 1), &f).ok());
  EXPECT_EQ(f.rest, varint_field);
  EXPECT_TRUE(f.payload.empty());
}

}  // namespace
}  // namespace kvc::wire
