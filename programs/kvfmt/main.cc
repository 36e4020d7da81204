// kvfmt: quantizes and dequantizes rows with the project's KV codecs, so any other
// implementation can check itself against ours byte for byte, and prints a config's
// chunk layout.
//
//   kvfmt quantize   --format main|index|swa --in F32FILE --out PACKED (--config F | --dim D)
//   kvfmt dequantize --format main|index|swa --in PACKED --out F32FILE (--config F | --dim D)
//   kvfmt layout     --config F [--chunk-tokens C]
//
// F32FILE is raw little-endian float32, R rows of D values (D = head_dim for main and
// swa, index_head_dim for index). PACKED is the R rows' codes followed by the R rows'
// scales, exactly like a codes section followed by its scales section in a chunk.
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "engine/spec/chunk_layout.h"
#include "engine/spec/kv_codec.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"
#include "programs/command_line.h"

static_assert(std::endian::native == std::endian::little, "file formats are little-endian");

namespace kvc {
namespace {

absl::Status WriteFile(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write \"", path, "\""));
  return absl::OkStatus();
}

// Row length: --dim, or the config's head_dim / index_head_dim for the format.
absl::StatusOr<int64_t> RowDim(KvFormat format, const std::string& config_path, int64_t dim) {
  if (dim == 0 && config_path.empty()) {
    return absl::InvalidArgumentError("give --config FILE or --dim N for the row length");
  }
  if (!config_path.empty()) {
    KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(config_path));
    dim = format == KvFormat::kIndexK ? config.index_head_dim : config.head_dim;
  }
  const int64_t block = SpecOf(format).scale_block;
  if (dim <= 0 || dim % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row length ", dim, " is not a positive multiple of ", block, " (the ",
                     SpecOf(format).name, " format's scale block)"));
  }
  return dim;
}

absl::Status Quantize(KvFormat format, int64_t dim, const std::string& in_path,
                      const std::string& out_path) {
  KVC_ASSIGN_OR_RETURN(std::string raw, ReadFile(in_path));
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(float));
  if (raw.size() % row_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("\"", in_path, "\" is ", raw.size(),
                                                   " bytes, not a whole number of ", dim,
                                                   "-value float32 rows (", row_bytes, " B each)"));
  }
  std::vector<float> x(raw.size() / sizeof(float));
  std::memcpy(x.data(), raw.data(), raw.size());
  int64_t non_finite = 0;
  for (float v : x) non_finite += std::isfinite(v) ? 0 : 1;
  if (non_finite > 0) {
    std::cerr << "kvfmt: warning: " << non_finite
              << " non-finite input values (NaN encodes as 0, inf saturates)\n";
  }
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> packed(PackedBytes(format, n));
  const int64_t codes = CodesBytes(format, n);
  Quantize(format, x, std::span(packed).first(codes), std::span(packed).subspan(codes));
  return WriteFile(out_path, packed.data(), packed.size());
}

absl::Status Dequantize(KvFormat format, int64_t dim, const std::string& in_path,
                        const std::string& out_path) {
  KVC_ASSIGN_OR_RETURN(std::string raw, ReadFile(in_path));
  const int64_t row_bytes = PackedBytes(format, dim);
  if (raw.size() % row_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", in_path, "\" is ", raw.size(), " bytes, not a whole number of packed ",
                     SpecOf(format).name, " rows of ", dim, " values (", row_bytes, " B each)"));
  }
  const int64_t rows = static_cast<int64_t>(raw.size()) / row_bytes;
  const int64_t n = rows * dim;
  const int64_t codes = CodesBytes(format, n);
  std::span<const uint8_t> packed(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
  std::vector<float> out(n);
  Dequantize(format, packed.first(codes), packed.subspan(codes), out);
  return WriteFile(out_path, out.data(), out.size() * sizeof(float));
}

absl::Status PrintLayout(const std::string& config_path, int64_t chunk_tokens) {
  KVC_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(config_path));
  KVC_ASSIGN_OR_RETURN(LayerSchedule schedule, BuildLayerSchedule(config));
  KVC_ASSIGN_OR_RETURN(ChunkLayout layout, BuildChunkLayout(config, schedule, chunk_tokens));
  std::printf("chunk of %lld tokens: %lld bytes (%.2f B/token), layout version %u\n",
              static_cast<long long>(layout.chunk_tokens),
              static_cast<long long>(layout.chunk_bytes), layout.bytes_per_token(),
              kKvLayoutVersion);
  std::printf("%6s %-13s %10s %10s %10s\n", "layer", "section", "positions", "offset", "bytes");
  for (const ChunkSection& s : layout.sections) {
    std::printf("%6lld %-13s %10lld %10lld %10lld\n", static_cast<long long>(s.layer),
                std::string(SectionKindName(s.kind)).c_str(), static_cast<long long>(s.positions),
                static_cast<long long>(s.offset), static_cast<long long>(s.bytes));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"kvfmt: the kvcache KV codecs and chunk layout"};
  app.require_subcommand(1);
  std::string format_name, in_path, out_path, config_path;
  int64_t dim = 0;
  int64_t chunk_tokens = kDefaultChunkTokens;
  CLI::App* quantize = app.add_subcommand("quantize", "float32 rows -> packed codes + scales");
  CLI::App* dequantize = app.add_subcommand("dequantize", "packed codes + scales -> float32 rows");
  for (CLI::App* sub : {quantize, dequantize}) {
    sub->add_option("--format", format_name, "main, index or swa")->required();
    sub->add_option("--in", in_path, "input file")->required();
    sub->add_option("--out", out_path, "output file")->required();
    sub->add_option("--config", config_path, "model config.json giving the row length");
    sub->add_option("--dim", dim, "row length (values per row)");
  }
  CLI::App* layout = app.add_subcommand("layout", "print a config's chunk layout");
  layout->add_option("--config", config_path, "model config.json")->required();
  layout->add_option("--chunk-tokens", chunk_tokens, "tokens per chunk");
  if (std::optional<int> stop = ParseCommandLine(app, argc, argv, "kvfmt")) return *stop;

  absl::Status status;
  if (layout->parsed()) {
    status = PrintLayout(config_path, chunk_tokens);
  } else {
    KvFormat format;
    status = ParseKvFormat(format_name, &format);
    absl::StatusOr<int64_t> row = status.ok() ? RowDim(format, config_path, dim) : status;
    if (!row.ok()) {
      status = row.status();
    } else if (quantize->parsed()) {
      status = Quantize(format, *row, in_path, out_path);
    } else {
      status = Dequantize(format, *row, in_path, out_path);
    }
  }
  if (!status.ok()) {
    std::cerr << "kvfmt: error: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvc

int main(int argc, char** argv) { return kvc::Main(argc, argv); }
