// A C entry point to kvcached's Fetch for Python's ctypes (python/kvcache/_native.py): the
// Python client's gRPC fetch reads each answer where gRPC received it and copies the
// payload once, straight into the caller's buffer, as the C++ client does. Through grpcio
// a payload is copied twice — from gRPC's buffers into a `bytes` object, then into the
// caller's — which bounded the Python client at ~0.6 × the C++ one (docs/benchmarks.md).
//
// Only the streaming part lives here: Python builds and serializes the FetchRequest, checks
// its arguments, runs the shared-memory path and maps the status to its exceptions. Built
// into python/kvcache/libkvcache_fetch.so by python/CMakeLists.txt from this file and
// wire/wire.cc, against the system's gRPC; Python falls back to grpcio when it is absent.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/channel_args.h"
#include "wire/wire.h"

namespace {

struct FetchChannel {
  std::shared_ptr<grpc::Channel> channel;
  std::string authorization;  // "Bearer <token>", or empty
};

// The outcome of a call for the caller: a gRPC status code and its message.
void Report(int32_t code, const std::string& message, int32_t* code_out, char* message_out,
            uint64_t message_room) {
  *code_out = code;
  if (message_room == 0) return;
  const size_t n = std::min<size_t>(message.size(), message_room - 1);
  std::memcpy(message_out, message.data(), n);
  message_out[n] = '\0';
}

// Copies a payload, in the pieces gRPC received it in, into parts [first, end) in order
// (their sizes add up to the payload's: checked before the call).
void Scatter(const std::vector<std::span<const uint8_t>>& payload, const uint64_t* part_addr,
             const uint64_t* part_bytes, uint64_t first, uint64_t end) {
  uint64_t part = first, in_part = 0;
  for (std::span<const uint8_t> p : payload) {
    for (size_t at = 0; at < p.size();) {
      while (part < end && in_part == part_bytes[part]) {  // full (or empty): the next one
        ++part;
        in_part = 0;
      }
      if (part == end) return;
      const size_t k =
          static_cast<size_t>(std::min<uint64_t>(p.size() - at, part_bytes[part] - in_part));
      std::memcpy(reinterpret_cast<uint8_t*>(part_addr[part]) + in_part, p.data() + at, k);
      at += k;
      in_part += k;
    }
  }
}

}  // namespace

extern "C" {

// A channel to one kvcached at `target` ("H:P" or "unix:PATH"), with the C++ client's
// channel settings and the Python client's: `service_config` (its retry policy, JSON; empty
// keeps the C++ client's), the largest message either way and HTTP/2's lookahead. `token`
// may be empty. Never fails: gRPC connects on the first call.
__attribute__((visibility("default"))) void* kvc_fetch_open(const char* target, const char* token,
                                                            const char* service_config,
                                                            int32_t max_message_bytes,
                                                            int32_t lookahead_bytes) {
  // The C++ client's settings (client/channel_args.h); Python's retry policy, when it sends one.
  grpc::ChannelArguments args =
      kvc::client::DaemonChannelArguments(max_message_bytes, lookahead_bytes);
  if (service_config != nullptr && *service_config != '\0')
    args.SetServiceConfigJSON(service_config);
  auto* fc = new FetchChannel;
  fc->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (token != nullptr && *token != '\0') fc->authorization = std::string("Bearer ") + token;
  return fc;
}

__attribute__((visibility("default"))) void kvc_fetch_close(void* channel) {
  delete static_cast<FetchChannel*>(channel);
}

// One Fetch call: `request` is a serialized FetchRequest for the n_keys 16-byte `keys`
// (packed end to end). Answer i must be keys[i] with a payload of chunk_bytes, which is
// copied into chunk i's parts: parts [parts_end[i-1], parts_end[i]) (from 0 for i = 0),
// part j being part_bytes[j] bytes at address part_addr[j] — one part for a chunk in one
// buffer, several for a page split over buffers (K and V). Returns how many leading chunks
// were written. *code is 0 when the stream ended well, else its gRPC status code with
// `message` (NOT_FOUND: a chunk not cached or the namespace unknown — the caller tells
// which — the leading chunks are usable; DATA_LOSS: an answer that is not the chunk asked
// for, the call cancelled; INVALID_ARGUMENT: a chunk's parts that do not add up to
// chunk_bytes, nothing asked). Waits up to timeout_s, also for the daemon to come up when
// wait_for_ready is set. Python's ctypes lets other threads run meanwhile.
__attribute__((visibility("default"))) uint64_t kvc_fetch(
    void* channel, const uint8_t* request, uint64_t request_bytes, const uint8_t* keys,
    uint64_t n_keys, uint64_t chunk_bytes, const uint64_t* part_addr, const uint64_t* part_bytes,
    const uint64_t* parts_end, double timeout_s, int32_t wait_for_ready, int32_t* code,
    char* message, uint64_t message_room) {
  for (uint64_t i = 0, first = 0; i < n_keys; first = parts_end[i++]) {
    uint64_t total = 0;
    for (uint64_t j = first; j < parts_end[i]; ++j) total += part_bytes[j];
    if (parts_end[i] < first || total != chunk_bytes) {
      Report(static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT),
             "destination " + std::to_string(i) + " is " + std::to_string(total) +
                 " bytes; a chunk of this namespace is " + std::to_string(chunk_bytes),
             code, message, message_room);
      return 0;
    }
  }
  auto* fc = static_cast<FetchChannel*>(channel);
  static const grpc::internal::RpcMethod kFetchMethod("/kvcache.v1.KVCache/Fetch",
                                                      grpc::internal::RpcMethod::SERVER_STREAMING);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
  ctx.set_wait_for_ready(wait_for_ready != 0);
  if (!fc->authorization.empty()) ctx.AddMetadata("authorization", fc->authorization);
  grpc::Slice request_slice(request, request_bytes);
  const grpc::ByteBuffer request_buffer(&request_slice, 1);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(fc->channel.get(), kFetchMethod,
                                                                    &ctx, request_buffer));
  grpc::ByteBuffer answer;
  std::vector<grpc::Slice> slices;
  std::vector<std::span<const uint8_t>> pieces;
  kvc::wire::StoreFrame frame;
  uint64_t got = 0;
  while (reader->Read(&answer)) {
    slices.clear();
    pieces.clear();
    absl::Status answer_ok = absl::DataLossError("its bytes cannot be read");
    if (answer.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) pieces.emplace_back(s.begin(), s.size());
      answer_ok = kvc::wire::CheckFetchAnswer(
          pieces, got < n_keys ? keys + got * kvc::wire::kKeyBytes : nullptr, chunk_bytes, &frame);
    }
    if (!answer_ok.ok()) {
      ctx.TryCancel();
      reader->Finish();
      Report(static_cast<int32_t>(grpc::StatusCode::DATA_LOSS),
             "Fetch answer " + std::to_string(got) + ": " + std::string(answer_ok.message()), code,
             message, message_room);
      return got;
    }
    Scatter(frame.payload, part_addr, part_bytes, got == 0 ? 0 : parts_end[got - 1],
            parts_end[got]);
    ++got;
  }
  const grpc::Status s = reader->Finish();
  Report(static_cast<int32_t>(s.error_code()), s.error_message(), code, message, message_room);
  return got;
}

}  // extern "C"
