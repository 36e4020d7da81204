// The baseline build of XXH3-64 (SSE2, every x86-64) and the choice among the builds.
#define KVC_XXH3_IMPL kXxh3Sse2
#define KVC_XXH3_NAME "sse2"
#include "storage/xxh3_build.inc"

#include <cstdlib>
#include <functional>
#include <vector>

#include "base/check.h"

namespace kvc::storage {

extern const Xxh3Impl kXxh3Avx2;
extern const Xxh3Impl kXxh3Avx512;

std::span<const Xxh3Impl* const> SupportedXxh3Impls() {
  static const std::vector<const Xxh3Impl*> supported = [] {
    std::vector<const Xxh3Impl*> v = {&kXxh3Sse2};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) v.push_back(&kXxh3Avx2);
    if (__builtin_cpu_supports("avx512f")) v.push_back(&kXxh3Avx512);
    for (const Xxh3Impl* impl : v)
      KVC_CHECK(impl->state_bytes <= Xxh3Stream::kStateBytes)
          << "XXH3 state of " << impl->state_bytes << " bytes";
    return v;
  }();
  return supported;
}

const Xxh3Impl& Xxh3() {
  // KVCACHE_XXH3=sse2|avx2|avx512 picks a narrower build (to compare them); the widest
  // otherwise, and also when the named one is not supported here.
  static const Xxh3Impl& chosen = [] {
    std::span<const Xxh3Impl* const> supported = SupportedXxh3Impls();
    if (const char* want = std::getenv("KVCACHE_XXH3"); want != nullptr)
      for (const Xxh3Impl* impl : supported)
        if (impl->name == want) return std::cref(*impl);
    return std::cref(*supported.back());
  }();
  return chosen;
}

}  // namespace kvc::storage
