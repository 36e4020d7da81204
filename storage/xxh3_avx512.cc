// XXH3-64 built for AVX-512 (compiled with -mavx512f; chosen only where the CPU has it: xxh3.cc).
#define KVC_XXH3_IMPL kXxh3Avx512
#define KVC_XXH3_NAME "avx512"
#include "storage/xxh3_build.inc"
