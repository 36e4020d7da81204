// XXH3-64 built for AVX2 (compiled with -mavx2; chosen only where the CPU has it: xxh3.cc).
#define KVC_XXH3_IMPL kXxh3Avx2
#define KVC_XXH3_NAME "avx2"
#include "storage/xxh3_build.inc"
