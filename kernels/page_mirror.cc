#include "kernels/page_mirror.h"

#include <algorithm>

#include "base/check.h"
#include "kernels/cuda_check.h"

namespace kvc::cuda {

PageMirror::~PageMirror() {
  for (auto& [id, e] : seqs_) Release(e);
}

void PageMirror::Release(Entry& e) {
  if (e.device != nullptr) cudaFree(e.device);
  if (e.written != nullptr) cudaEventDestroy(e.written);
  e.device = nullptr;
  e.written = nullptr;
}

std::function<void()> PageMirror::Written(const View& view, uint64_t sequence, int64_t first,
                                          std::span<const uint64_t> versions, cudaStream_t stream) {
  KVC_CHECK(view.hold.owns_lock() && view.hold.mutex() == &mu_)
      << "page mirror: writes marked without holding the sequence's pages";
  Entry& e = seqs_.at(sequence);
  KVC_CHECK(first >= 0 && first + static_cast<int64_t>(versions.size()) <= e.capacity)
      << "page mirror: writes marked in pages " << first << ".." << first + versions.size()
      << " of " << e.capacity;
  std::copy(versions.begin(), versions.end(), e.versions.begin() + first);
  if (e.written == nullptr) CUDA_CHECK(cudaEventCreate(&e.written));
  CUDA_CHECK(cudaEventRecord(e.written, stream));
  return [landed = e.landed, write = ++e.writes] {
    uint64_t seen = landed->load();
    while (seen < write && !landed->compare_exchange_weak(seen, write)) {
    }
  };
}

PageMirror::View PageMirror::Pages(uint64_t sequence, std::span<const std::vector<uint8_t>> pages,
                                   std::span<const uint64_t> versions, int64_t count,
                                   size_t page_bytes, cudaStream_t stream) {
  std::unique_lock<Mutex> lock(mu_);
  Entry& e = seqs_[sequence];
  e.last_use = ++clock_;
  if (e.written != nullptr) CUDA_CHECK(cudaStreamWaitEvent(stream, e.written, 0));
  if (e.page_bytes != page_bytes) {  // new (or a layout change): start over
    if (e.device != nullptr) {
      CUDA_CHECK(cudaStreamSynchronize(stream));  // the writes done before the memory goes
      bytes_ -= static_cast<size_t>(e.capacity) * e.page_bytes;
    }
    Release(e);
    e = Entry{nullptr, 0, page_bytes, {}, clock_};
  }
  if (count > e.capacity) {
    const int64_t capacity = std::max<int64_t>(count, 2 * e.capacity);
    uint8_t* grown = nullptr;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grown), capacity * page_bytes));
    if (e.device != nullptr) {
      CUDA_CHECK(cudaMemcpyAsync(grown, e.device, e.capacity * page_bytes, cudaMemcpyDeviceToDevice,
                                 stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      CUDA_CHECK(cudaFree(e.device));
    }
    bytes_ += static_cast<size_t>(capacity - e.capacity) * page_bytes;
    e.device = grown;
    e.capacity = capacity;
    e.versions.resize(capacity, 0);
    EvictFor(sequence);
  }
  Entry& cur = seqs_.at(sequence);  // EvictFor never drops `sequence`
  for (int64_t p = 0; p < count; ++p) {
    // Version 0 (or none given) means unknown: always uploaded.
    const uint64_t v = static_cast<size_t>(p) < versions.size() ? versions[p] : 0;
    if (v != 0 && cur.versions[p] == v) {
      ++stats_.reused_pages;
      continue;
    }
    CUDA_CHECK(cudaMemcpyAsync(cur.device + p * page_bytes, pages[p].data(), page_bytes,
                               cudaMemcpyHostToDevice, stream));
    cur.versions[p] = v;
    ++stats_.uploaded_pages;
  }
  return View{cur.device, std::move(lock)};
}

void PageMirror::EvictFor(uint64_t keep) {
  while (bytes_ > budget_ && seqs_.size() > 1) {
    auto victim = seqs_.end();
    for (auto it = seqs_.begin(); it != seqs_.end(); ++it) {
      const bool host_current = it->second.landed->load() >= it->second.writes;
      if (it->first != keep && host_current &&
          (victim == seqs_.end() || it->second.last_use < victim->second.last_use))
        victim = it;
    }
    if (victim == seqs_.end()) return;
    if (victim->second.written != nullptr) {  // its device writes done before the memory goes
      CUDA_CHECK(cudaEventSynchronize(victim->second.written));
    }
    Release(victim->second);
    bytes_ -= static_cast<size_t>(victim->second.capacity) * victim->second.page_bytes;
    seqs_.erase(victim);
  }
}

PageMirror::Stats PageMirror::stats() const {
  MutexLock lock(mu_);
  Stats s = stats_;
  s.sequences = static_cast<int64_t>(seqs_.size());
  for (const auto& [id, e] : seqs_) s.awaiting_host += e.landed->load() < e.writes;
  return s;
}

std::shared_ptr<PageMirror> MakePageMirror(size_t budget_bytes) {
  if (budget_bytes == 0) {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      cudaGetLastError();
      total = size_t{4} << 30;
    }
    budget_bytes = total / 4;
  }
  return std::make_shared<PageMirror>(budget_bytes);
}

}  // namespace kvc::cuda
