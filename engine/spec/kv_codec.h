// The number formats of the V4.1 Flash KV, exactly as the reference implementation's
// quantize-dequantize defines them (docs/kv-format.md has the byte-level description).
//
//   kMainKv  compressed main KV (stored): E2M1 values, one E4M3 scale per 16 channels,
//            s = e4m3(max(amax, 6·2^-9) / 6) (round to nearest even, not a power of two).
//   kIndexK  indexer keys (stored): E2M1 values, one E8M0 scale per 32 channels,
//            s = 2^ceil(log2(max(amax, 6·2^-126) / 6)).
//   kSwaKv   sliding-window KV (engine only, never stored): E4M3 values, one E8M0 scale
//            per 32 channels, s = 2^ceil(log2(max(amax, 1e-4) / 448)).
// Values are q = round_nearest_even(clamp(x / s, ±max)) and dequantize to q·s. FP4 codes
// pack two per byte, low nibble = even element: byte = code[2i] | code[2i+1] << 4.
//
// Non-finite input has a defined result (the reference never produces it; |x| ≲ 10):
// NaN counts as 0 for the block maximum and encodes as +0; ±inf saturates: its block gets
// the largest scale whose largest value is still a finite float, and the value the
// largest code. So dequantized output is always finite. All functions are pure and
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace kvc {

// ---- Scalar element formats ----
uint8_t EncodeE2M1(float x);     // 4-bit code: RNE, saturating at ±6, NaN → 0
float DecodeE2M1(uint8_t code);  // low 4 bits used; code 8 is -0.0
uint8_t EncodeE4M3(float x);     // OCP e4m3fn: RNE, saturating at ±448, NaN → 0x7F
float DecodeE4M3(uint8_t code);  // 0x7F / 0xFF decode to NaN
float DecodeE8M0(uint8_t code);  // 2^(code-127); 255 decodes to NaN
// E8M0 code of 2^ceil(log2(y)) for y > 0 (saturates at 2^127, code 254).
uint8_t E8M0CeilPow2(float y);

// ---- Block formats ----
enum class KvFormat { kMainKv, kIndexK, kSwaKv };

struct KvFormatSpec {
  absl::string_view name;  // "main", "index", "swa"
  int64_t scale_block;     // channels per scale
  int64_t value_bits;      // 4 (E2M1) or 8 (E4M3)
};
const KvFormatSpec& SpecOf(KvFormat format);
// Parses "main", "index" or "swa".
[[nodiscard]] absl::Status ParseKvFormat(absl::string_view name, KvFormat* out);

// Bytes of the codes and of the scales for `n` values; n must be a multiple of the
// format's scale block (KVC_CHECK).
int64_t CodesBytes(KvFormat format, int64_t n);
int64_t ScalesBytes(KvFormat format, int64_t n);
inline int64_t PackedBytes(KvFormat format, int64_t n) {
  return CodesBytes(format, n) + ScalesBytes(format, n);
}

// Quantizes x (a whole number of scale blocks, blocks never straddle rows because every
// row length is a multiple of the block) into codes and scales sized as above.
void Quantize(KvFormat format, std::span<const float> x, std::span<uint8_t> codes,
              std::span<uint8_t> scales);
// Inverse of Quantize: out[i] = value(code[i]) · scale(block of i).
void Dequantize(KvFormat format, std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                std::span<float> out);
// Quantize then dequantize in place: the reference's in-place QAT, bit for bit.
void FakeQuantize(KvFormat format, std::span<float> x);

}  // namespace kvc
