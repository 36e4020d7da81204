// libFuzzer target: the model-config parser and what is built from a config it accepts
// (the layer schedule and the chunk layout). Any input must give a config or an error —
// never a crash, a hang, a sanitizer report or an accepted config that breaks the schedule.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/spec/chunk_layout.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvc::ModelConfig> config = kvc::ParseModelConfig(text, "fuzz");
  if (!config.ok()) return 0;
  absl::StatusOr<kvc::LayerSchedule> schedule = kvc::BuildLayerSchedule(*config);
  if (!schedule.ok()) return 0;
  for (int64_t chunk : {64, 256}) (void)kvc::BuildChunkLayout(*config, *schedule, chunk);
  return 0;
}
