// Byte tokens: the C++ encoder and decoder give the ids the Python tokenizer wrote
// (byte_tokens_vectors.json), and decoding skips what is not a byte.
#include "engine/spec/byte_tokens.h"

#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvc {
namespace {

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

TEST(ByteTokensTest, MatchThePythonTokenizersVectors) {
  std::ifstream in(std::string(KVC_SOURCE_DIR) + "/tests/engine/spec/byte_tokens_vectors.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_GE(doc["vectors"].size(), 4u);
  for (const auto& v : doc["vectors"]) {
    const std::string text = FromHex(v["text_hex"]);
    const std::vector<uint32_t> want = v["ids"].get<std::vector<uint32_t>>();
    EXPECT_EQ(EncodeBytes(text), want) << v["text_hex"];
    EXPECT_EQ(DecodeBytes(want), text);
  }
}

TEST(ByteTokensTest, DecodingSkipsSpecialsAndIdsPastTheBytes) {
  EXPECT_EQ(DecodeBytes({0, 3 + 'a', 1, 2, 3 + 'b', 259, 500}), "ab");
  EXPECT_TRUE(HoldsByteTokens(259));
  EXPECT_FALSE(HoldsByteTokens(258));
}

}  // namespace
}  // namespace kvc
