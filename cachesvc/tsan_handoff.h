// Happens-before edges that pass through gRPC, for ThreadSanitizer builds.
//
// gRPC is not instrumented: when one thread hands a reactor back to gRPC (StartRead) and
// gRPC runs the reactor's next callback on another thread, the order between them is real
// but invisible to TSan, which then reports the reactor's own fields as raced. A reactor
// whose state has no lock of its own marks each hand-off: HandOffToGrpc(this) right before
// giving control away, TookBackFromGrpc(this) first thing in each callback. No-ops in
// other builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace kvc::cachesvc {

inline void HandOffToGrpc([[maybe_unused]] void* reactor) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(reactor);
#endif
}

inline void TookBackFromGrpc([[maybe_unused]] void* reactor) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(reactor);
#endif
}

}  // namespace kvc::cachesvc
