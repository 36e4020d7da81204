// The bytes kvcached and its clients exchange outside the generated protobuf code, written
// once: a chunk key on the wire, keys packed end to end (LookupRequest.packed_chunk_keys),
// and the FetchResponse frame the daemon writes by hand so a payload leaves the RAM arena
// without a copy. python/kvcache/_wire.py mirrors this module; both are checked against
// tests/wire/wire_vectors.json, whose frames protobuf's own encoder wrote
// (scripts/wire_vectors.py), so the hand framing cannot drift from the .proto.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"

namespace kvc::wire {

inline constexpr size_t kKeyBytes = 16;

// The metadata a cluster's node-to-node calls carry the cluster credential in
// (proto/kvcache/v1/peer.proto; checked by cachesvc/peer_service.h).
inline constexpr char kPeerCredentialMetadata[] = "x-kvcache-peer";

// A key as a bytes field carries it.
std::string KeyBytes(const ChunkKey& key);
// A bytes field back to a key; InvalidArgument naming `what` and the size if it is not 16
// bytes (the daemon's word for a client's mistake; clients map it to DataLoss).
absl::StatusOr<ChunkKey> KeyFrom(std::string_view bytes, std::string_view what = "a chunk key");

// Keys end to end, 16 bytes each.
std::string PackKeys(std::span<const ChunkKey> keys);
// The keys of a packed field; InvalidArgument when it is not whole keys or holds more
// than `max_keys`.
absl::StatusOr<std::vector<ChunkKey>> UnpackKeys(std::string_view packed, size_t max_keys);

// FetchResponse{chunk_key = key, payload = <payload_bytes bytes>} up to the payload: the
// frame is this header followed by the payload itself (fields 1 and 2, length-delimited).
std::string FetchResponseHeader(const ChunkKey& key, uint64_t payload_bytes);

// The payload field's tag and length (StoreRequest.payload): a client sends a chunk as a
// StoreRequest serialized without its payload, this, and the payload bytes where they lie
// (a slice of the caller's memory), so the payload is not copied into a message first.
std::string StorePayloadHeader(uint64_t payload_bytes);

// A StoreRequest as it arrived, in pieces (a gRPC message's receive buffers), split so that
// its payload is never gathered: `rest` is every other field's bytes, end to end — itself a
// StoreRequest encoding, with no payload, for protobuf to parse — and `payload` the
// payload field's bytes as views into the pieces (the last payload field, as protobuf
// keeps the last of a singular field). InvalidArgument naming the byte where the pieces
// stop being a protobuf message (a bad tag or varint, a length past the end, a group).
struct StoreFrame {
  std::string rest;
  std::vector<std::span<const uint8_t>> payload;
  uint64_t payload_bytes = 0;
};
absl::Status SplitStoreRequest(std::span<const std::span<const uint8_t>> pieces, StoreFrame* out);
// The same for a FetchResponse as a client receives it (its payload, field 2, left in
// gRPC's buffers and copied once, into the caller's), `rest` holding the chunk key's field.
// InvalidArgument "not a FetchResponse (…)"; a client reports it as DataLoss.
absl::Status SplitFetchResponsePieces(std::span<const std::span<const uint8_t>> pieces,
                                      StoreFrame* out);
// The chunk key's bytes in that `rest` (the last chunk_key field, as protobuf keeps; empty
// when there is none), for a client that parses no protobuf (client/fetch_c.cc).
// InvalidArgument "not a FetchResponse (…)" when `rest` is no protobuf message.
absl::StatusOr<std::string> FetchResponseKeyField(std::string_view rest);

// A Fetch answer as a client receives it, split into `frame` and checked against what was
// asked: the 16-byte key `want_key` (null: no more chunks were asked for) with a payload of
// chunk_bytes. DataLoss naming what is wrong (bytes that are no FetchResponse, another
// chunk, another size, an answer past the last chunk asked for); the C++ client and the
// Python package's native fetch (client/fetch_c.cc) both read answers through it.
absl::Status CheckFetchAnswer(std::span<const std::span<const uint8_t>> pieces,
                              const uint8_t* want_key, uint64_t chunk_bytes, StoreFrame* frame);

}  // namespace kvc::wire
