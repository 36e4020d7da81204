// The CUDA runtime API on the CPU, for the kernel emulation build (tests/cudaemu/README.md).
#pragma once
#include "cudaemu/runtime.h"
