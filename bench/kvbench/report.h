// How every kvbench case reports: one JSON object (--json) or its text form, printed by
// PrintReport; a ratio against its peer is written by RatioNote, so "met" and "NOT met"
// read the same in every table.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

// Prints the result (its JSON, or to_text of it) on stdout, or the error on stderr; the
// program's exit code (0, or 1 on an error).
int PrintReport(const absl::StatusOr<nlohmann::json>& result, bool json,
                const std::function<std::string(const nlohmann::json&)>& to_text);

// "" without a target; else "  (target >= T: met)" or "  (target >= T: NOT met)".
std::string RatioNote(double ratio, double target);

}  // namespace kvc::bench
