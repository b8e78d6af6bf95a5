// A tensor-parallel group of ranks as threads of one process, for the GPT-2's tests of
// tensor-parallel modules without MPI.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/core/check.h"

namespace zero::models::gpt2_test {

// A tensor-parallel group of `size` ranks as threads of this process, for the GPT-2's two
// collectives: all_gather and all_reduce (fp32, summed in rank order, so every rank gets the
// same bits) return once every rank has made the same call. Counts the calls per op.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), sends_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  // Each rank's `send` to `combine` (which reads them all into this rank's own memory), then
  // `finish` once no rank reads any send any more: in-place calls are safe.
  template <typename Combine, typename Finish>
  void exchange(int rank, const void* send, Combine combine, Finish finish) {
    sends_[static_cast<size_t>(rank)] = send;
    arrive();
    combine(sends_);
    arrive();
    finish();
  }

 private:
  void arrive() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.notify_all();
    } else {
      all_arrived_.wait(lock, [&] { return generation_ != generation; });
    }
  }

  int size_;
  std::vector<const void*> sends_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class ThreadGroupCommunicator : public Communicator {
 public:
  ThreadGroupCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return group_.size(); }
  std::string transport() const override { return "threads"; }
  Event all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    return all_gather_bytes(send, recv, count * dtype_size(dtype));
  }
  Event all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    ++counters_.calls[static_cast<size_t>(CollectiveOp::kAllGather)];
    std::vector<char> all(bytes * static_cast<size_t>(group_.size()));
    group_.exchange(
        rank_, send,
        [&](const std::vector<const void*>& sends) {
          for (size_t r = 0; r < sends.size(); ++r) std::memcpy(&all[r * bytes], sends[r], bytes);
        },
        [&] { std::memcpy(recv, all.data(), all.size()); });
    return Event();
  }
  Event all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    ZERO_CHECK(dtype == DType::kFloat32, "the test's group sums fp32 only");
    ++counters_.calls[static_cast<size_t>(CollectiveOp::kAllReduce)];
    std::vector<float> sum(count, 0.0f);
    group_.exchange(
        rank_, send,
        [&](const std::vector<const void*>& sends) {
          for (const void* from : sends) {
            const float* values = static_cast<const float*>(from);
            for (size_t i = 0; i < count; ++i) sum[i] += values[i];
          }
        },
        [&] { std::memcpy(recv, sum.data(), count * sizeof(float)); });
    return Event();
  }
  // Not called by the GPT-2's modules.
  Event reduce_scatter(const void*, void*, size_t, DType) override { return unused(); }
  Event broadcast(void*, size_t, DType, int) override { return unused(); }
  Event barrier() override { return unused(); }
  Event all_to_all_bytes(const void*, void*, size_t) override { return unused(); }
  Stream& stream() override { return stream_; }
  const CommCounters& counters() const override { return counters_; }
  void set_timeout(std::chrono::milliseconds) override {}
  void set_desync_check(bool) override {}
  bool desync_check() const override { return false; }
  std::string flight_record() const override { return ""; }
  size_t staging_bytes(CollectiveOp, size_t, DType) const override { return 0; }
  void set_staging_buffer(void*, size_t) override {}
  void clear_staging_buffer() override {}

 private:
  static Event unused() { throw Error("the test's thread group has no such collective"); }

  ThreadGroup& group_;
  int rank_;
  CommCounters counters_;
  Stream stream_{"thread-group"};
};

}  // namespace zero::models::gpt2_test
