#include "storage/shared_link.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status_macros.h"

namespace kvc::storage {
namespace {
constexpr size_t kWriteBatch = 32;  // chunks a write-behind round sends together
}  // namespace

SharedTierLink::SharedTierLink(std::shared_ptr<SharedTier> tier, bool write_behind,
                               uint64_t backlog_max_bytes, double retry_after_s)
    : tier_(std::move(tier)),
      write_behind_(write_behind),
      backlog_max_bytes_(backlog_max_bytes),
      retry_after_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(retry_after_s))) {
  stats_.name = tier_->name();
  stats_.write_behind = write_behind_;
  if (write_behind_) writer_ = std::thread([this] { WriterLoop(); });
}

SharedTierLink::~SharedTierLink() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void SharedTierLink::Note(const absl::Status& s) {
  MutexLock lk(mu_);
  // A miss or bad bytes are answers; the tier is reachable.
  const bool answered = s.ok() || absl::IsNotFound(s) || absl::IsDataLoss(s);
  stats_.reachable = answered;
  if (!s.ok() && !absl::IsNotFound(s)) stats_.last_error = std::string(s.message());
  if (answered) {
    down_until_ = {};
  } else {
    down_until_ = std::chrono::steady_clock::now() + retry_after_;
  }
}

absl::Status SharedTierLink::Skipping() const {
  MutexLock lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now >= down_until_) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the shared tier is not answering (", stats_.last_error, "); asked again in ",
                   absl::FormatDuration(
                       absl::Trunc(absl::FromChrono(down_until_ - now), absl::Milliseconds(1)))));
}

std::vector<absl::Status> SharedTierLink::Store(std::span<const SharedPut> puts) {
  std::vector<const SharedPut*> now;  // written through
  std::vector<size_t> now_index;
  std::vector<absl::Status> status(puts.size());
  if (write_behind_) {
    MutexLock lk(mu_);
    for (size_t i = 0; i < puts.size(); ++i) {
      const SharedPut& p = puts[i];
      if (backlog_bytes_ + p.payload.size() > backlog_max_bytes_) {
        now.push_back(&p);  // the backlog is full: this one is written through
        now_index.push_back(i);
        continue;
      }
      Queued q{p.key, p.meta, std::vector<uint8_t>(p.payload.size())};
      p.payload.CopyTo(q.bytes.data());
      backlog_bytes_ += q.bytes.size();
      backlog_.push_back(std::move(q));
    }
    changed_.notify_all();
  } else {
    for (size_t i = 0; i < puts.size(); ++i) {
      now.push_back(&puts[i]);
      now_index.push_back(i);
    }
  }
  if (now.empty()) return status;
  if (absl::Status down = Skipping(); !down.ok()) {
    for (size_t i : now_index) status[i] = down;
    MutexLock lk(mu_);
    stats_.put_errors += now_index.size();
    return status;
  }
  std::vector<SharedPut> batch;
  batch.reserve(now.size());
  for (const SharedPut* p : now) batch.push_back(*p);
  std::vector<absl::Status> written = tier_->PutMany(batch);
  uint64_t ok = 0, failed = 0;
  for (size_t j = 0; j < written.size(); ++j) {
    status[now_index[j]] = written[j];
    Note(written[j]);
    ++(written[j].ok() ? ok : failed);
  }
  MutexLock lk(mu_);
  stats_.puts += ok;
  stats_.put_errors += failed;
  return status;
}

void SharedTierLink::WriterLoop() {
  MutexLock lk(mu_);
  while (true) {
    while (backlog_.empty() && !stop_) changed_.wait(mu_);
    if (backlog_.empty()) return;  // stopping, and all sent
    std::vector<Queued> round;
    while (!backlog_.empty() && round.size() < kWriteBatch) {
      in_flight_.push_back(backlog_.front().key);
      round.push_back(std::move(backlog_.front()));
      backlog_.pop_front();
    }
    lk.unlock();
    std::vector<SharedPut> puts;
    puts.reserve(round.size());
    for (const Queued& q : round) puts.push_back({q.key, q.meta, q.bytes});
    const std::vector<absl::Status> written = tier_->PutMany(puts);
    bool any_failed = false;
    for (const absl::Status& s : written) {
      Note(s);
      any_failed |= !s.ok();
    }
    lk.lock();
    in_flight_.clear();
    // What failed goes back to the front, in order, and is tried again after a pause (the
    // tier is down or slow); on a stop it is given up (the chunks stay on the node's SSD).
    std::vector<Queued> again;
    for (size_t i = 0; i < round.size(); ++i) {
      if (written[i].ok()) {
        ++stats_.puts;
        backlog_bytes_ -= round[i].bytes.size();
      } else {
        ++stats_.put_errors;
        again.push_back(std::move(round[i]));
      }
    }
    if (stop_ && any_failed) {
      for (const Queued& q : again) backlog_bytes_ -= q.bytes.size();
      for (const Queued& q : backlog_) backlog_bytes_ -= q.bytes.size();
      backlog_.clear();
      changed_.notify_all();
      return;
    }
    for (auto it = again.rbegin(); it != again.rend(); ++it) backlog_.push_front(std::move(*it));
    changed_.notify_all();
    if (any_failed) changed_.wait_for(mu_, std::chrono::seconds(1));
  }
}

std::vector<absl::Status> SharedTierLink::Fetch(SharedTag ns, std::span<const ChunkKey> keys,
                                                std::span<const std::span<uint8_t>> outs,
                                                std::vector<SharedChunk>* metas) {
  if (absl::Status down = Skipping(); !down.ok()) {
    MutexLock lk(mu_);
    stats_.read_errors += keys.size();
    return std::vector<absl::Status>(keys.size(), down);
  }
  std::vector<absl::Status> got = tier_->GetMany(ns, keys, outs, metas);
  uint64_t hits = 0, misses = 0, errors = 0;
  for (const absl::Status& s : got) {
    Note(s);
    if (s.ok()) {
      ++hits;
    } else if (absl::IsNotFound(s)) {
      ++misses;
    } else {
      ++errors;
    }
  }
  MutexLock lk(mu_);
  stats_.hits += hits;
  stats_.misses += misses;
  stats_.read_errors += errors;
  return got;
}

std::vector<absl::StatusOr<bool>> SharedTierLink::Contains(std::span<const ChunkKey> keys) {
  if (absl::Status down = Skipping(); !down.ok())
    return std::vector<absl::StatusOr<bool>>(keys.size(), down);
  std::vector<absl::StatusOr<bool>> found = tier_->ContainsMany(keys);
  for (const absl::StatusOr<bool>& f : found) Note(f.status());
  return found;
}

std::vector<absl::Status> SharedTierLink::Remove(std::span<const ChunkKey> keys) {
  {
    // A queued copy written after the remove would bring the chunk back: drop it, and
    // wait for one being sent now.
    MutexLock lk(mu_);
    auto removed = [&](const ChunkKey& k) {
      return std::find(keys.begin(), keys.end(), k) != keys.end();
    };
    for (auto it = backlog_.begin(); it != backlog_.end();) {
      if (removed(it->key)) {
        backlog_bytes_ -= it->bytes.size();
        it = backlog_.erase(it);
      } else {
        ++it;
      }
    }
    while (std::any_of(in_flight_.begin(), in_flight_.end(), removed)) changed_.wait(mu_);
  }
  if (absl::Status down = Skipping(); !down.ok())
    return std::vector<absl::Status>(keys.size(), down);
  std::vector<absl::Status> status = tier_->RemoveMany(keys);
  uint64_t removed = 0;
  for (const absl::Status& s : status) {
    Note(s);
    removed += s.ok();
  }
  MutexLock lk(mu_);
  stats_.removes += removed;
  return status;
}

absl::Status SharedTierLink::Drain(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  MutexLock lk(mu_);
  while (!backlog_.empty() || !in_flight_.empty()) {
    if (changed_.wait_until(mu_, until) == std::cv_status::timeout)
      return absl::DeadlineExceededError(
          absl::StrCat("the shared tier's backlog still holds ", backlog_.size(), " chunks"));
  }
  return absl::OkStatus();
}

void SharedTierLink::SetTag(NamespaceId ns, SharedTag tag, std::string account) {
  MutexLock lk(mu_);
  shares_[ns] = {tag, std::move(account)};
}

SharedTierLink::Share SharedTierLink::ShareOf(NamespaceId ns) const {
  MutexLock lk(mu_);
  auto it = shares_.find(ns);
  return it == shares_.end() ? Share{ns, ""} : it->second;
}

absl::StatusOr<uint64_t> SharedTierLink::AccountBytes(const std::string& account) {
  KVC_RETURN_IF_ERROR(Skipping());
  absl::StatusOr<uint64_t> stored = tier_->AccountBytes(account);
  Note(stored.status());
  if (!stored.ok()) return stored.status();
  MutexLock lk(mu_);
  uint64_t queued = 0;
  for (const Queued& q : backlog_) {
    if (q.meta.account == account) queued += q.bytes.size();
  }
  return *stored + queued;
}

absl::StatusOr<SharedSweep> SharedTierLink::Sweep(int64_t now_s) {
  KVC_RETURN_IF_ERROR(Skipping());
  absl::StatusOr<SharedSweep> swept = tier_->SweepExpired(now_s);
  Note(swept.status());
  if (!swept.ok()) return swept.status();
  MutexLock lk(mu_);
  ++stats_.sweeps;
  stats_.swept += swept->removed;
  stats_.removes += swept->removed;
  return swept;
}

SharedTierStats SharedTierLink::Stats() const {
  MutexLock lk(mu_);
  SharedTierStats s = stats_;
  s.backlog_chunks = backlog_.size() + in_flight_.size();
  s.backlog_bytes = backlog_bytes_;
  return s;
}

}  // namespace kvc::storage
