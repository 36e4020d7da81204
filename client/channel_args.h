// The channel settings every client of one kvcached uses (CacheClient, and the Python
// client's native fetch path in fetch_c.cc): message sizes, HTTP/2's lookahead, a connection
// of its own, and what happens when a connection attempt fails.
#pragma once

#include <grpcpp/support/channel_arguments.h>

namespace kvc::client {

// A call that meets no connection (a connection attempt just failed, or the daemon is
// restarting) is tried again within the call's deadline: 5 attempts, backoff from 50 ms to
// 1 s, so a daemon that is down fails a call after ~0.4 s on average instead of at once.
// Every method of the API may run twice: a stored chunk is already_present the second time,
// a lease not released ends by itself. The Python client sends the same policy
// (python/kvcache/_common.py).
inline constexpr char kRetryServiceConfig[] = R"({"methodConfig": [{
  "name": [{"service": "kvcache.v1.KVCache"}],
  "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s",
                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})";

// After a failed connection attempt gRPC fails every call at once until the next one, 1 s
// later by default, growing ×1.6 to 2 minutes. One refused connect among 32 clients then
// failed ~60,000 calls in 4 s (ClientTest.ThirtyTwoConcurrentClients…, one CI run), and a
// client hammering a daemon through a 10 s restart waited up to ~10 s more after it came
// back. A daemon is worth asking again soon: from 20 ms, never over 1 s apart; and a call
// that met no connection is tried again (kRetryServiceConfig).
inline void ReconnectSoonAndRetry(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  args.SetServiceConfigJSON(kRetryServiceConfig);
}

inline grpc::ChannelArguments DaemonChannelArguments(int max_message_bytes, int lookahead_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // Chunks are ~220 KiB: a 64 KiB initial HTTP/2 window stalls every message on window
  // updates (programs/kvcached/main.cc sets the daemon's side).
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, lookahead_bytes);
  // Each client a TCP connection of its own: by default gRPC gives every channel of a
  // process to the same daemon one shared connection, and 8 clients of one process then
  // fetched 2.2 GB/s where 8 connections fetch 2.6-3.5 (kvbench service, 8 clients).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  ReconnectSoonAndRetry(args);
  return args;
}

}  // namespace kvc::client
