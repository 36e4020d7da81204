// PageMirror on a GPU: pages read back equal the host's; a second call with the same
// versions uploads nothing; a changed page (new version) is uploaded alone; growing keeps
// the pages already there; past the budget the least recently used other sequence goes.
// Skipped, saying so, where there is no GPU;
// the <test>_emu build runs the same checks on the CPU emulation of CUDA (tests/cudaemu).
#include "kernels/page_mirror.h"

#include <functional>
#include <random>

#include "gtest/gtest.h"
#include "kernels/device_buffer.h"
#include "kernels/kv_dequant.h"
#include "tests/testing/seed.h"

namespace kvc::cuda {
namespace {

constexpr size_t kPage = 4096 + 512;

std::vector<std::vector<uint8_t>> RandomPages(std::mt19937_64& rng, int n) {
  std::vector<std::vector<uint8_t>> pages(n, std::vector<uint8_t>(kPage));
  for (auto& p : pages)
    for (uint8_t& b : p) b = static_cast<uint8_t>(rng());
  return pages;
}

std::vector<uint8_t> Download(const uint8_t* device, int64_t count) {
  std::vector<uint8_t> out(count * kPage);
  EXPECT_EQ(cudaMemcpy(out.data(), device, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

std::vector<uint8_t> Flat(const std::vector<std::vector<uint8_t>>& pages, int64_t count) {
  std::vector<uint8_t> out;
  for (int64_t p = 0; p < count; ++p) out.insert(out.end(), pages[p].begin(), pages[p].end());
  return out;
}

TEST(PageMirrorTest, UploadsOnlyWhatChangedAndKeepsPagesAcrossGrowth) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  PageMirror mirror(64 * kPage);
  std::vector<std::vector<uint8_t>> pages = RandomPages(rng, 6);
  std::vector<uint64_t> versions = {11, 12, 13, 14, 15, 16};
  {
    PageMirror::View v = mirror.Pages(7, pages, versions, 3, kPage, nullptr);
    EXPECT_EQ(Download(v.device, 3), Flat(pages, 3));
  }
  EXPECT_EQ(mirror.stats().uploaded_pages, 3);
  {
    PageMirror::View v = mirror.Pages(7, pages, versions, 3, kPage, nullptr);
    EXPECT_EQ(Download(v.device, 3), Flat(pages, 3));
  }
  EXPECT_EQ(mirror.stats().uploaded_pages, 3) << "same versions: nothing uploaded";
  EXPECT_EQ(mirror.stats().reused_pages, 3);
  pages[1][100] ^= 0xFF;
  versions[1] = 21;
  {
    PageMirror::View v = mirror.Pages(7, pages, versions, 6, kPage, nullptr);  // and grow
    EXPECT_EQ(Download(v.device, 6), Flat(pages, 6));
  }
  EXPECT_EQ(mirror.stats().uploaded_pages, 3 + 1 + 3);  // page 1 again, pages 3..5 new
}

// A backend writing compressed entries into the pages on its stream (WriteEntries): the
// page is current on the device under the host's new version, so nothing is uploaded over
// it while the host's bytes are still landing, and a reader on another stream sees the
// write (its stream waits for the writer's).
TEST(PageMirrorTest, WritesOnTheDeviceAreReadOnAnotherStreamAndNotUploadedOver) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  PageMirror mirror(64 * kPage);
  const std::vector<std::vector<uint8_t>> pages = RandomPages(rng, 2);
  std::vector<uint64_t> versions = {31, 32};
  std::vector<uint8_t> written = RandomPages(rng, 1)[0];
  written.resize(300);
  DeviceBuffer<uint8_t> source{std::span(written)};
  cudaStream_t writer = nullptr, reader = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking), cudaSuccess);
  constexpr size_t kAt = kPage + 100;  // in page 1
  {
    PageMirror::View v = mirror.Pages(9, pages, versions, 2, kPage, writer);
    ASSERT_EQ(cudaMemcpyAsync(v.device + kAt, source.get(), written.size(),
                              cudaMemcpyDeviceToDevice, writer),
              cudaSuccess);
    versions[1] = 41;  // the host claims the page for the write; its bytes land later
    const std::function<void()> landed =
        mirror.Written(v, 9, 1, std::span(versions).subspan(1, 1), writer);
    landed();  // (this test's host never gets the bytes; nothing here evicts)
  }
  std::vector<uint8_t> expect = Flat(pages, 2);
  std::copy(written.begin(), written.end(), expect.begin() + kAt);
  const int64_t uploaded = mirror.stats().uploaded_pages;
  {
    PageMirror::View v = mirror.Pages(9, pages, versions, 2, kPage, reader);
    std::vector<uint8_t> back(2 * kPage);
    ASSERT_EQ(cudaMemcpyAsync(back.data(), v.device, back.size(), cudaMemcpyDeviceToHost, reader),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
    EXPECT_EQ(back, expect);
  }
  EXPECT_EQ(mirror.stats().uploaded_pages, uploaded) << "the page the device wrote went up again";
  cudaStreamDestroy(reader);
  cudaStreamDestroy(writer);
}

TEST(PageMirrorTest, PastTheBudgetTheLeastRecentlyUsedOtherSequenceGoes) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  PageMirror mirror(10 * kPage);
  const std::vector<std::vector<uint8_t>> a = RandomPages(rng, 4), b = RandomPages(rng, 4),
                                          c = RandomPages(rng, 4);
  const std::vector<uint64_t> va = {1, 2, 3, 4}, vb = {5, 6, 7, 8}, vc = {9, 10, 11, 12};
  { auto v = mirror.Pages(1, a, va, 4, kPage, nullptr); }
  { auto v = mirror.Pages(2, b, vb, 4, kPage, nullptr); }
  { auto v = mirror.Pages(1, a, va, 4, kPage, nullptr); }  // 1 is now the more recent
  {
    auto v = mirror.Pages(3, c, vc, 4, kPage, nullptr);  // 12 pages > 10: sequence 2 goes
    EXPECT_EQ(Download(v.device, 4), Flat(c, 4));
  }
  EXPECT_EQ(mirror.stats().sequences, 2);
  const int64_t before = mirror.stats().uploaded_pages;
  { auto v = mirror.Pages(1, a, va, 4, kPage, nullptr); }
  EXPECT_EQ(mirror.stats().uploaded_pages, before) << "sequence 1 stayed";
  {
    auto v = mirror.Pages(2, b, vb, 4, kPage, nullptr);
    EXPECT_EQ(Download(v.device, 4), Flat(b, 4));
  }
  EXPECT_EQ(mirror.stats().uploaded_pages, before + 4) << "sequence 2 was dropped";
}

// A sequence whose device writes have not reached the host's pages yet stays past the
// budget even when it is the least recently used: dropped, its pages would come back from
// the host's stale copies. Once they have landed it goes as any other.
TEST(PageMirrorTest, ASequenceWhoseDeviceWritesTheHostLacksIsNotDropped) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: the kernels compile but do not run here";
  std::mt19937_64 rng(testing::FreshSeed());
  PageMirror mirror(10 * kPage);
  const std::vector<std::vector<uint8_t>> a = RandomPages(rng, 4), b = RandomPages(rng, 4),
                                          c = RandomPages(rng, 4), d = RandomPages(rng, 4);
  std::vector<uint64_t> va = {1, 2, 3, 4};
  const std::vector<uint64_t> vb = {5, 6, 7, 8}, vc = {9, 10, 11, 12}, vd = {13, 14, 15, 16};
  std::function<void()> landed;
  {
    auto v = mirror.Pages(1, a, va, 4, kPage, nullptr);
    va[3] = 21;  // a write into page 3 on the device, claimed under version 21
    landed = mirror.Written(v, 1, 3, std::span(va).subspan(3, 1), nullptr);
  }
  { auto v = mirror.Pages(2, b, vb, 4, kPage, nullptr); }
  { auto v = mirror.Pages(3, c, vc, 4, kPage, nullptr); }  // past the budget: not 1, but 2
  EXPECT_EQ(mirror.stats().sequences, 2);
  int64_t before = mirror.stats().uploaded_pages;
  { auto v = mirror.Pages(1, a, va, 4, kPage, nullptr); }
  EXPECT_EQ(mirror.stats().uploaded_pages, before) << "sequence 1 was dropped with its write";
  EXPECT_EQ(mirror.stats().awaiting_host, 1);
  landed();  // the host has the bytes now
  EXPECT_EQ(mirror.stats().awaiting_host, 0);
  { auto v = mirror.Pages(3, c, vc, 4, kPage, nullptr); }  // 3 more recent than 1
  { auto v = mirror.Pages(4, d, vd, 4, kPage, nullptr); }  // past the budget: 1 goes
  before = mirror.stats().uploaded_pages;
  { auto v = mirror.Pages(1, a, va, 4, kPage, nullptr); }
  EXPECT_EQ(mirror.stats().uploaded_pages, before + 4) << "sequence 1 stayed after landing";
}

}  // namespace
}  // namespace kvc::cuda
