#include "bench/kvbench/report.h"

#include <iostream>

#include "absl/strings/str_format.h"

namespace kvc::bench {

int PrintReport(const absl::StatusOr<nlohmann::json>& result, bool json,
                const std::function<std::string(const nlohmann::json&)>& to_text) {
  if (!result.ok()) {
    std::cerr << "kvbench: error: " << result.status().message() << "\n";
    return 1;
  }
  std::string text = json ? result->dump(2) : to_text(*result);
  if (text.empty() || text.back() != '\n') text += '\n';
  std::cout << text;
  return 0;
}

std::string RatioNote(double ratio, double target) {
  if (target <= 0) return "";
  return absl::StrFormat("  (target >= %.1f: %s)", target, ratio >= target ? "met" : "NOT met");
}

}  // namespace kvc::bench
