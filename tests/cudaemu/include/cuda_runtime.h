// The CUDA runtime on the CPU, for the kernel emulation build (see tests/cudaemu/README.md).
#pragma once
#include "cudaemu/device.h"
