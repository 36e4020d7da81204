// wire::SplitStoreRequest against protobuf's own encoder and parser: random StoreRequests,
// cut into random pieces (as gRPC hands a message over), split back into the fields
// protobuf parses and the payload left in place.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvcache/v1/kvcache.pb.h"
#include "tests/testing/seed.h"
#include "wire/wire.h"

namespace kvc::wire {
namespace {

namespace pb = ::kvcache::v1;

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// `message` cut at random places, some cuts 0 or 1 byte apart (empty and one-byte pieces).
std::vector<std::span<const uint8_t>> Cut(std::mt19937_64& rng, const std::string& message) {
  std::vector<size_t> cuts = {0, message.size()};
  const int n = static_cast<int>(rng() % 40);
  for (int i = 0; i < n; ++i) {
    const size_t at = rng() % (message.size() + 1);
    cuts.push_back(at);
    if (rng() % 4 == 0) cuts.push_back(std::min(message.size(), at + rng() % 2));
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::span<const uint8_t>> pieces;
  const auto* base = reinterpret_cast<const uint8_t*>(message.data());
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    pieces.emplace_back(base + cuts[i], cuts[i + 1] - cuts[i]);
  return pieces;
}

std::string Joined(const std::vector<std::span<const uint8_t>>& views) {
  std::string s;
  for (auto v : views) s.append(reinterpret_cast<const char*>(v.data()), v.size());
  return s;
}

TEST(StoreFrameTest, FieldsParseAsProtobufsAndThePayloadStaysInItsPieces) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int round = 0; round < 300; ++round) {
    pb::StoreRequest req;
    if (rng() % 4) req.set_namespace_id(static_cast<uint32_t>(rng()));
    if (rng() % 2) req.set_parent_key(RandomBytes(rng, 16));
    const int tokens = static_cast<int>(rng() % 70);
    for (int i = 0; i < tokens; ++i) req.add_tokens(static_cast<uint32_t>(rng() % 200000));
    req.set_payload(RandomBytes(rng, rng() % 3 == 0 ? rng() % 40 : 1000 + rng() % 300000));
    if (rng() % 2) req.set_durability(pb::DURABILITY_DURABLE);
    if (rng() % 2) req.set_ttl_seconds(static_cast<uint32_t>(rng()));
    if (rng() % 3 == 0) req.set_chunk_key(RandomBytes(rng, 16));
    const std::string message = req.SerializeAsString();
    const std::vector<std::span<const uint8_t>> pieces = Cut(rng, message);

    StoreFrame frame;
    ASSERT_TRUE(SplitStoreRequest(pieces, &frame).ok()) << "round " << round;
    pb::StoreRequest rest;
    ASSERT_TRUE(rest.ParseFromString(frame.rest));
    EXPECT_TRUE(rest.payload().empty());
    rest.set_payload(Joined(frame.payload));
    EXPECT_EQ(rest.SerializeAsString(), message) << "round " << round;
    EXPECT_EQ(frame.payload_bytes, req.payload().size());
    // Views into the pieces, not copies.
    const auto* lo = reinterpret_cast<const uint8_t*>(message.data());
    for (auto v : frame.payload) {
      EXPECT_GE(v.data(), lo);
      EXPECT_LE(v.data() + v.size(), lo + message.size());
    }
  }
}

// What a client sends: the other fields serialized, the payload's header, the payload.
TEST(StoreFrameTest, AMessageSentWithoutCopyingItsPayloadParsesAsTheWholeRequest) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (const size_t bytes : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{227840},
                             size_t{16384 + rng() % 300000}}) {
    pb::StoreRequest req;
    req.set_namespace_id(static_cast<uint32_t>(rng()));
    for (int i = 0; i < 64; ++i) req.add_tokens(static_cast<uint32_t>(rng() % 129280));
    req.set_durability(pb::DURABILITY_DURABLE);
    const std::string payload = RandomBytes(rng, bytes);
    const std::string sent = req.SerializeAsString() + StorePayloadHeader(bytes) + payload;
    req.set_payload(payload);
    pb::StoreRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(sent)) << bytes;
    EXPECT_EQ(parsed.SerializeAsString(), req.SerializeAsString()) << bytes;
  }
}

// A FetchResponse as a client receives it, in pieces: the daemon's framing (header, then
// the payload) and protobuf's own encoding both split into the key and the payload in place.
TEST(StoreFrameTest, AFetchResponseInPiecesSplitsIntoItsKeyAndThePayloadInPlace) {
  std::mt19937_64 rng(testing::FreshSeed());
  for (int round = 0; round < 100; ++round) {
    pb::FetchResponse resp;
    resp.set_chunk_key(RandomBytes(rng, 16));
    resp.set_payload(RandomBytes(rng, rng() % 300000));
    ChunkKey key;
    std::memcpy(key.bytes.data(), resp.chunk_key().data(), 16);
    const std::string message =
        round % 2 ? resp.SerializeAsString()
                  : FetchResponseHeader(key, resp.payload().size()) + resp.payload();
    StoreFrame frame;
    ASSERT_TRUE(SplitFetchResponsePieces(Cut(rng, message), &frame).ok()) << round;
    pb::FetchResponse rest;
    ASSERT_TRUE(rest.ParseFromString(frame.rest));
    EXPECT_EQ(rest.chunk_key(), resp.chunk_key());
    EXPECT_EQ(Joined(frame.payload), resp.payload()) << round;
  }
  const std::string cut_short = std::string("\x12\x05", 2) + "abc";
  const std::span<const uint8_t> one(reinterpret_cast<const uint8_t*>(cut_short.data()),
                                     cut_short.size());
  StoreFrame frame;
  EXPECT_NE(SplitFetchResponsePieces(std::span(&one, 1), &frame)
                .message()
                .find("not a FetchResponse (field 2 running past the end at byte 0)"),
            std::string::npos);
}

TEST(StoreFrameTest, TheLastPayloadFieldIsThePayloadAsForProtobuf) {
  pb::StoreRequest a, b;
  a.set_namespace_id(7);
  a.set_payload("first payload");
  b.set_payload("second");
  b.set_ttl_seconds(9);
  const std::string message = a.SerializeAsString() + b.SerializeAsString();  // a merge
  pb::StoreRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(message));
  const std::span<const uint8_t> one(reinterpret_cast<const uint8_t*>(message.data()),
                                     message.size());
  StoreFrame frame;
  ASSERT_TRUE(SplitStoreRequest(std::span(&one, 1), &frame).ok());
  EXPECT_EQ(Joined(frame.payload), parsed.payload());
  pb::StoreRequest rest;
  ASSERT_TRUE(rest.ParseFromString(frame.rest));
  EXPECT_EQ(rest.namespace_id(), 7u);
  EXPECT_EQ(rest.ttl_seconds(), 9u);
}

TEST(StoreFrameTest, BytesThatAreNoMessageAreRefusedNamingWhere) {
  pb::StoreRequest req;
  req.set_namespace_id(3);
  req.set_payload(std::string(100, 'p'));
  const std::string good = req.SerializeAsString();
  struct Case {
    std::string bytes, expected;
  };
  const std::vector<Case> cases = {
      {good.substr(0, good.size() - 1), "field 4 running past the end at byte 2"},
      {std::string("\x08", 1), "field 1 running past the end at byte 0"},
      {std::string("\x0b\x00", 2), "wire type 3 at byte 0"},
      {std::string("\x00\x01", 2), "field number 0 at byte 0"},
      {std::string("\x22\xff\xff", 3), "a malformed length at byte 0"},
      {std::string(11, '\xff'), "a malformed tag at byte 0"},
  };
  for (const Case& c : cases) {
    const std::span<const uint8_t> one(reinterpret_cast<const uint8_t*>(c.bytes.data()),
                                       c.bytes.size());
    StoreFrame frame;
    const absl::Status s = SplitStoreRequest(std::span(&one, 1), &frame);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(s.message().find("not a StoreRequest (" + c.expected + ")"), std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace kvc::wire
