// libFuzzer target: the trace reader (Mooncake and agent-session JSON lines). Any file
// gives requests or an error naming its line; accepted requests turn into prompts of the
// stated length.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "base/check.h"
#include "bench/trace/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kvc-trace-fuzz-" + std::to_string(getpid()) + ".jsonl";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  absl::StatusOr<std::vector<kvc::trace::Request>> r = kvc::trace::ReadTrace(path, 64);
  if (!r.ok()) return 0;
  int64_t tokens = 0;
  for (const kvc::trace::Request& q : *r) {
    tokens += q.input_tokens;
    if (tokens > (int64_t{1} << 24)) break;  // keep each run fast; the limit is checked below
    KVC_CHECK(q.input_tokens <= kvc::trace::kMaxPromptTokens);
    const std::vector<uint32_t> prompt = kvc::trace::PromptTokens(q, 129280);
    KVC_CHECK(static_cast<int64_t>(prompt.size()) == q.input_tokens);
  }
  return 0;
}
