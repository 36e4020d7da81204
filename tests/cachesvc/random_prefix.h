// A random prefix of whole chunks for a namespace: token ids and payload bytes (never all
// zero), for the client and service tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "client/client.h"

namespace kvc::testing {

struct Prefix {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> payloads;
};

inline Prefix MakePrefix(std::mt19937_64& rng, const client::RemoteNamespace& ns, size_t chunks) {
  Prefix p;
  for (size_t i = 0; i < chunks * ns.chunk_tokens; ++i)
    p.tokens.push_back(static_cast<uint32_t>(rng() % 512));
  p.payloads.resize(chunks * ns.chunk_bytes);
  for (uint8_t& b : p.payloads) b = static_cast<uint8_t>(rng());
  return p;
}

}  // namespace kvc::testing
