#include "bench/trace/trace.h"

#include <algorithm>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/splitmix.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvc::trace {

uint64_t Mix(uint64_t x) { return SplitMix64(x); }

namespace {

uint64_t HashName(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return Mix(h);
}

// A non-negative integer field, or an error naming it.
absl::StatusOr<int64_t> Field(const nlohmann::json& j, const char* name, const std::string& where,
                              bool required = true, int64_t fallback = 0) {
  auto it = j.find(name);
  if (it == j.end()) {
    if (!required) return fallback;
    return absl::InvalidArgumentError(absl::StrCat(where, ": no \"", name, "\""));
  }
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", name, "\" must be a non-negative integer, got ", it->dump()));
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> Seconds(const nlohmann::json& j, const char* name,
                               const std::string& where) {
  auto it = j.find(name);
  if (it == j.end()) return 0.0;
  if (!it->is_number() || it->get<double>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", name, "\" must be a non-negative number, got ", it->dump()));
  }
  return it->get<double>();
}

absl::Status ReadMooncake(const nlohmann::json& j, const std::string& where, Request* r) {
  absl::StatusOr<int64_t> ts = Field(j, "timestamp", where);
  absl::StatusOr<int64_t> in = Field(j, "input_length", where);
  absl::StatusOr<int64_t> out = Field(j, "output_length", where, /*required=*/false);
  for (const auto* s : {&ts, &in, &out})
    if (!s->ok()) return s->status();
  auto ids = j.find("hash_ids");
  if (ids == j.end() || !ids->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"hash_ids\" must be an array"));
  }
  if (*in > kMaxPromptTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": input_length ", *in, " is over the limit of ", kMaxPromptTokens));
  }
  const int64_t blocks = (*in + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;
  if (static_cast<int64_t>(ids->size()) != blocks) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", ids->size(), " hash ids for ", *in,
                                                   " input tokens (", blocks, " blocks of 512)"));
  }
  r->arrival_s = static_cast<double>(*ts) / 1000.0;
  r->input_tokens = *in;
  r->output_tokens = *out;
  for (const nlohmann::json& id : *ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": hash id ", id.dump(), " is not a non-negative integer"));
    }
    r->block_ids.push_back(id.get<uint64_t>());
  }
  return absl::OkStatus();
}

struct SessionState {
  int64_t turn = 0;
  int64_t tokens = 0;
  double arrival_s = 0;
};

absl::Status ReadAgentTurn(const nlohmann::json& j, const std::string& where,
                           std::map<std::string, SessionState>* sessions, Request* r) {
  auto s = j.find("session");
  if (s == j.end() || !(s->is_string() || s->is_number_integer())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"session\" must be a string"));
  }
  const std::string name = s->is_string() ? s->get<std::string>() : s->dump();
  absl::StatusOr<int64_t> turn = Field(j, "turn", where);
  absl::StatusOr<int64_t> appended = Field(j, "tokens", where);
  absl::StatusOr<int64_t> output = Field(j, "output", where, /*required=*/false);
  absl::StatusOr<double> think = Seconds(j, "think_s", where);
  absl::StatusOr<double> start = Seconds(j, "start_s", where);
  for (const auto* st : {&turn, &appended, &output})
    if (!st->ok()) return st->status();
  if (!think.ok()) return think.status();
  if (!start.ok()) return start.status();
  SessionState& state = (*sessions)[name];
  if (*turn != state.turn + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": session \"", name, "\" turn ", *turn, " follows turn ", state.turn));
  }
  if (*appended > kMaxPromptTokens - state.tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": session \"", name, "\" grows past ", kMaxPromptTokens, " tokens"));
  }
  state.turn = *turn;
  state.tokens += *appended;
  state.arrival_s = *turn == 1 ? *start : state.arrival_s + *think;
  r->arrival_s = state.arrival_s;
  r->input_tokens = state.tokens;
  r->output_tokens = *output;
  r->session = HashName(name);
  return absl::OkStatus();
}

}  // namespace

uint32_t TokenOf(uint64_t id, uint64_t j, uint32_t vocab_size) {
  return static_cast<uint32_t>(Mix(Mix(id) ^ j) % vocab_size);
}

std::vector<uint32_t> PromptTokens(const Request& r, uint32_t vocab_size) {
  std::vector<uint32_t> tokens(static_cast<size_t>(r.input_tokens));
  for (int64_t p = 0; p < r.input_tokens; ++p) {
    tokens[p] = r.block_ids.empty()
                    ? TokenOf(r.session, static_cast<uint64_t>(p), vocab_size)
                    : TokenOf(r.block_ids[p / kMooncakeBlockTokens],
                              static_cast<uint64_t>(p % kMooncakeBlockTokens), vocab_size);
  }
  return tokens;
}

absl::StatusOr<std::vector<Request>> ReadTrace(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace \"", path, "\""));
  std::vector<Request> out;
  std::map<std::string, SessionState> sessions;
  enum { kUnknown, kMooncake, kAgent } format = kUnknown;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", n);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return absl::InvalidArgumentError(where + ": not a JSON object");
    if (format == kUnknown) format = j.contains("hash_ids") ? kMooncake : kAgent;
    Request r;
    KVC_RETURN_IF_ERROR(format == kMooncake ? ReadMooncake(j, where, &r)
                                            : ReadAgentTurn(j, where, &sessions, &r));
    if (format == kMooncake && !out.empty() && r.arrival_s < out.back().arrival_s) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": timestamp goes backwards"));
    }
    out.push_back(std::move(r));
  }
  // Agent turns arrive by time; a session's turns keep their order (stable sort).
  std::stable_sort(out.begin(), out.end(),
                   [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
  if (limit > 0 && static_cast<int64_t>(out.size()) > limit) out.resize(limit);
  return out;
}

double TraceSeconds(const std::vector<Request>& requests) {
  if (requests.empty()) return 0;
  return requests.back().arrival_s - requests.front().arrival_s;
}

}  // namespace kvc::trace
