// Runs a kernel's threads as fibers on the launching host thread (x86-64 System V): a
// fiber switch saves the callee-saved registers and the SSE/x87 control words on the
// fiber's stack and swaps stack pointers — a few nanoseconds, so kernels with a barrier
// per tile run at a usable speed. Stacks come from a pool with a guard page below each.
// Under AddressSanitizer every switch is announced to it and a reused stack unpoisoned.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "cudaemu/device.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDAEMU_ASAN 1
#else
#define CUDAEMU_ASAN 0
#endif

// Under ThreadSanitizer each CUDA thread is a TSan fiber, switched without synchronizing;
// only a barrier (release on arrival, acquire on leaving) or the start and end of a launch
// orders one thread's accesses before another's. So two threads of a block touching the
// same memory with no barrier between them, one writing, is reported as a data race: the
// racecheck of a GPU's compute-sanitizer, on the CPU. This file is built without TSan
// instrumentation (CMake defines CUDAEMU_TSAN instead): the scheduler's own bookkeeping
// is not the kernels' business.
#if defined(CUDAEMU_TSAN) && CUDAEMU_TSAN
#include <sanitizer/tsan_interface.h>
#else
#undef CUDAEMU_TSAN
#define CUDAEMU_TSAN 0
#endif

extern "C" void cudaemu_switch(void** save_sp, void* load_sp);
extern "C" void cudaemu_trampoline();
// The section of all __shared__ variables (device.h), from the linker; absent when no
// linked kernel has one.
extern "C" uint8_t __start_cudaemu_shared[] __attribute__((weak));
extern "C" uint8_t __stop_cudaemu_shared[] __attribute__((weak));

asm(R"(
  .text
  .globl cudaemu_switch
  .type cudaemu_switch, @function
cudaemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cudaemu_switch, .-cudaemu_switch

  .globl cudaemu_trampoline
  .type cudaemu_trampoline, @function
cudaemu_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size cudaemu_trampoline, .-cudaemu_trampoline
)");

namespace cudaemu {
namespace {

constexpr size_t kStackBytes = size_t{256} << 10;
constexpr size_t kGuardBytes = 4096;
constexpr int kMaxThreads = 1024;
constexpr size_t kMaxSharedBytes = 48 << 10;  // without cudaFuncSetAttribute's opt-in

[[noreturn]] void Fail(const char* fmt, auto... args) {
  std::fprintf(stderr, "cudaemu: ");
  std::fprintf(stderr, fmt, args...);
  std::fprintf(stderr, "\n");
  std::abort();
}

struct Stack {
  uint8_t* base = nullptr;  // lowest usable byte, above the guard page
};

enum class Wait { kNone, kBlock, kWarp };

struct Fiber {
  ThreadContext ctx{};
  int linear = 0;
  void* sp = nullptr;
  Stack stack;
  bool done = false;
  Wait wait = Wait::kNone;
  uint64_t wait_gen = 0;
  bool started = false;
  void* asan_fake_stack = nullptr;
  void* tsan_fiber = nullptr;
};

// Threads still running, how many of them wait here, and the generation, which moves on
// when the last one arrives (a thread that has returned counts as arrived, as on the GPU).
struct Barrier {
  int live = 0;
  int arrived = 0;
  uint64_t gen = 0;
};

struct Warp {
  Barrier barrier;
  uint64_t slots[2][32] = {};
  uint64_t slot_gen[2][32] = {};
};

struct Run {
  const char* kernel = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier block;
  Fiber* current = nullptr;
  void* scheduler_sp = nullptr;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
  uint8_t* shared = nullptr;
  size_t shared_bytes = 0;
  void* tsan_scheduler = nullptr;
};

std::mutex g_launch_mu;  // launches from any host thread run one at a time
Run* g_run = nullptr;
std::vector<Stack> g_stacks;
std::vector<void*> g_tsan_fibers;  // one per stack, reused like the stacks

Stack NewStack() {
  void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) Fail("cannot map a fiber stack");
  mprotect(m, kGuardBytes, PROT_NONE);
  return Stack{static_cast<uint8_t*>(m) + kGuardBytes};
}

void AfterSwitchIntoFiber(Fiber* f) {
#if CUDAEMU_ASAN
  __sanitizer_finish_switch_fiber(f->asan_fake_stack, &g_run->scheduler_stack_bottom,
                                  &g_run->scheduler_stack_size);
#else
  (void)f;
#endif
}

// Fiber → scheduler; returns when the scheduler resumes this fiber.
void Yield() {
  Fiber* f = g_run->current;
#if CUDAEMU_ASAN
  __sanitizer_start_switch_fiber(&f->asan_fake_stack, g_run->scheduler_stack_bottom,
                                 g_run->scheduler_stack_size);
#endif
#if CUDAEMU_TSAN
  __tsan_switch_to_fiber(g_run->tsan_scheduler, __tsan_switch_to_fiber_no_sync);
#endif
  cudaemu_switch(&f->sp, g_run->scheduler_sp);
  AfterSwitchIntoFiber(f);
}

void TsanRelease([[maybe_unused]] Barrier& b) {
#if CUDAEMU_TSAN
  __tsan_release(&b);
#endif
}

void TsanAcquire([[maybe_unused]] Barrier& b) {
#if CUDAEMU_TSAN
  __tsan_acquire(&b);
#endif
}

void ReleaseIfAllArrived(Barrier& b) {
  if (b.arrived > 0 && b.arrived == b.live) {
    b.arrived = 0;
    ++b.gen;
  }
}

// The calling fiber waits at b until every live thread has arrived; the last to arrive
// releases the others and goes on.
void Arrive(Fiber& f, Barrier& b, Wait kind) {
  TsanRelease(b);
  if (++b.arrived == b.live) {
    b.arrived = 0;
    ++b.gen;
  } else {
    f.wait = kind;
    f.wait_gen = b.gen;
    Yield();
  }
  TsanAcquire(b);
}

void ThreadExit(Fiber* f) {
  Run& r = *g_run;
  Barrier& w = r.warps[f->linear / 32].barrier;
  f->done = true;
  --r.block.live;
  --w.live;
  TsanRelease(r.block);
  TsanRelease(w);
  ReleaseIfAllArrived(r.block);
  ReleaseIfAllArrived(w);
}

extern "C" void FiberMain(Fiber* f) {
  AfterSwitchIntoFiber(f);
  (*g_run->body)();
  ThreadExit(f);
#if CUDAEMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, g_run->scheduler_stack_bottom,
                                 g_run->scheduler_stack_size);
#endif
#if CUDAEMU_TSAN
  // Not synchronizing: the block's other threads must not be ordered after this one by the
  // fibers' run order. ThreadExit released the block barrier, which the scheduler acquires
  // once the block is done, for the next block and the host.
  __tsan_switch_to_fiber(g_run->tsan_scheduler, __tsan_switch_to_fiber_no_sync);
#endif
  void* unused = nullptr;
  cudaemu_switch(&unused, g_run->scheduler_sp);
  std::abort();  // a finished fiber is never resumed
}

void* InitialStackPointer(const Stack& s, Fiber* f) {
#if CUDAEMU_ASAN
  __asan_unpoison_memory_region(s.base, kStackBytes);
#endif
  const uintptr_t top = (reinterpret_cast<uintptr_t>(s.base) + kStackBytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top - 128);
  // What cudaemu_switch pops: control words, r15, r14, r13, r12, rbx, rbp, return address.
  const uint64_t mxcsr = __builtin_ia32_stmxcsr();
  sp[0] = mxcsr | (uint64_t{0x037F} << 32);
  sp[1] = 0;
  sp[2] = 0;
  sp[3] = reinterpret_cast<uint64_t>(&FiberMain);
  sp[4] = reinterpret_cast<uint64_t>(f);
  sp[5] = 0;
  sp[6] = 0;
  sp[7] = reinterpret_cast<uint64_t>(&cudaemu_trampoline);
  return sp;
}

void Resume(Run& r, Fiber& f) {
  r.current = &f;
#if CUDAEMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack.base, kStackBytes);
#endif
#if CUDAEMU_TSAN
  // A thread's start sees what the host and the scheduler did before it.
  __tsan_switch_to_fiber(f.tsan_fiber, f.started ? __tsan_switch_to_fiber_no_sync : 0);
#endif
  f.started = true;
  cudaemu_switch(&r.scheduler_sp, f.sp);
#if CUDAEMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  r.current = nullptr;
}

bool Runnable(const Run& r, const Fiber& f) {
  if (f.done) return false;
  switch (f.wait) {
    case Wait::kNone:
      return true;
    case Wait::kBlock:
      return f.wait_gen != r.block.gen;
    case Wait::kWarp:
      return f.wait_gen != r.warps[f.linear / 32].barrier.gen;
  }
  return false;
}

[[noreturn]] void Deadlock(const Run& r, uint3 b) {
  int at_block = 0, at_warp = 0;
  for (const Fiber& f : r.fibers) {
    if (f.done) continue;
    (f.wait == Wait::kBlock ? at_block : at_warp) += 1;
  }
  Fail(
      "kernel %s, block (%u,%u,%u): deadlock — %d threads wait at __syncthreads, %d at a warp "
      "barrier or shuffle, and none can go on (a barrier in divergent code?)",
      r.kernel, b.x, b.y, b.z, at_block, at_warp);
}

// Written without instrumentation: under AddressSanitizer the section holds redzones
// between the variables (-fsanitize-sections), and kernels must not touch those.
__attribute__((no_sanitize_address)) void FillSharedWithGarbage(uint8_t* shared, size_t bytes) {
  volatile uint8_t* p = __start_cudaemu_shared;
  for (; p != nullptr && p < __stop_cudaemu_shared; ++p) *p = 0xA5;
  std::fill_n(shared, bytes, uint8_t{0xA5});
}

void RunBlock(Run& r, uint3 b, dim3 grid, dim3 block, uint64_t block_number) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  FillSharedWithGarbage(r.shared, r.shared_bytes);
  r.block = Barrier{n, 0, 0};
  r.warps.assign((n + 31) / 32, Warp{});
  for (int w = 0; w < static_cast<int>(r.warps.size()); ++w) {
    r.warps[w].barrier.live = std::min(32, n - 32 * w);
  }
  for (int i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    f = Fiber{};
    f.linear = i;
    f.ctx.thread_idx =
        uint3{static_cast<unsigned>(i) % block.x, (static_cast<unsigned>(i) / block.x) % block.y,
              static_cast<unsigned>(i) / (block.x * block.y)};
    f.ctx.block_idx = b;
    f.ctx.block_dim = block;
    f.ctx.grid_dim = grid;
    f.stack = g_stacks[i];
    f.tsan_fiber = g_tsan_fibers[i];
    f.sp = InitialStackPointer(f.stack, &f);
  }
  // Passes alternate direction, and so do blocks: of two threads that touch the same
  // data without a barrier between them, each goes first in some pass or block.
  for (uint64_t pass = block_number; r.block.live > 0; ++pass) {
    bool moved = false;
    for (int j = 0; j < n; ++j) {
      Fiber& f = r.fibers[pass % 2 == 0 ? j : n - 1 - j];
      if (!Runnable(r, f)) continue;
      f.wait = Wait::kNone;
      Resume(r, f);
      moved = true;
    }
    if (!moved) Deadlock(r, b);
  }
#if CUDAEMU_TSAN
  __tsan_acquire(&r.block);  // the next block and the host after the launch see this one
#endif
}

Fiber& Current(const char* what) {
  if (g_run == nullptr || g_run->current == nullptr) Fail("%s used outside a kernel", what);
  return *g_run->current;
}

}  // namespace

const ThreadContext& Self(const char* what) { return Current(what).ctx; }

int Lane() { return Current("a warp lane").linear % 32; }

void* DynamicShared() {
  Current("extern __shared__ memory");
  return g_run->shared;
}

void SyncThreads() { Arrive(Current("__syncthreads"), g_run->block, Wait::kBlock); }

namespace {

void CheckMask(const Fiber& f, unsigned mask, const char* what) {
  const int lane = f.linear % 32;
  if ((mask >> lane & 1u) == 0) {
    Fail("kernel %s: lane %d calls %s with mask %#x that leaves it out", g_run->kernel, lane, what,
         mask);
  }
}

}  // namespace

void SyncWarp(unsigned mask) {
  Fiber& f = Current("__syncwarp");
  CheckMask(f, mask, "__syncwarp");
  Arrive(f, g_run->warps[f.linear / 32].barrier, Wait::kWarp);
}

uint64_t Shuffle(unsigned mask, uint64_t value, int src) {
  Fiber& f = Current("a warp shuffle");
  CheckMask(f, mask, "a warp shuffle");
  Warp& w = g_run->warps[f.linear / 32];
  const int lane = f.linear % 32;
  const uint64_t gen = w.barrier.gen;
  const int slot = static_cast<int>(gen & 1);  // two slot sets: no second barrier needed
  w.slots[slot][lane] = value;
  w.slot_gen[slot][lane] = gen + 1;
  Arrive(f, w.barrier, Wait::kWarp);
  if (src < 0 || src >= 32 || w.slot_gen[slot][src] != gen + 1) {
    Fail(
        "kernel %s: lane %d reads lane %d in a shuffle that lane did not join (exited or "
        "diverged)",
        g_run->kernel, lane, src);
  }
  return w.slots[slot][src];
}

bool CheckGrid(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const char* bad = nullptr;
  if (threads == 0 || threads > kMaxThreads || block.z > 64) {
    bad = "block size (1..1024 threads, z <= 64)";
  } else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    bad = "grid size (x >= 1, 1 <= y, z <= 65535)";
  } else if (shared_bytes > kMaxSharedBytes) {
    bad = "dynamic shared memory (48 KiB without an opt-in)";
  }
  if (bad != nullptr) {
    std::fprintf(stderr,
                 "cudaemu: launch of %s rejected: %s; grid (%u,%u,%u) block (%u,%u,%u) shared "
                 "%zu\n",
                 kernel, bad, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes);
    SetLastError(cudaErrorInvalidConfiguration);
    return false;
  }
  return true;
}

void RunGrid(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes,
             const std::function<void()>& body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  std::lock_guard<std::mutex> lock(g_launch_mu);
  while (g_stacks.size() < threads) {
    g_stacks.push_back(NewStack());
#if CUDAEMU_TSAN
    g_tsan_fibers.push_back(__tsan_create_fiber(0));
#else
    g_tsan_fibers.push_back(nullptr);
#endif
  }
  // Dynamic shared memory is exactly as large as asked (so AddressSanitizer sees overruns).
  std::unique_ptr<uint8_t[]> shared(new uint8_t[shared_bytes > 0 ? shared_bytes : 1]);
  Run r;
  r.kernel = kernel;
  r.body = &body;
  r.shared = shared.get();
  r.shared_bytes = shared_bytes;
#if CUDAEMU_TSAN
  r.tsan_scheduler = __tsan_get_current_fiber();
#endif
  r.fibers.resize(threads);
  g_run = &r;
  uint64_t number = 0;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) RunBlock(r, uint3{x, y, z}, grid, block, number++);
    }
  }
  g_run = nullptr;
}

}  // namespace cudaemu
