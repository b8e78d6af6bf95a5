// A communicator that forwards everything to another one: tests derive from it and override
// only the calls whose behaviour they change (a delay, another summation order), so a new
// Communicator method is forwarded in one place.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "zero/collectives/communicator.h"

namespace zero::testing {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string transport() const override { return inner_->transport(); }
  Event all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    return inner_->all_gather(send, recv, count, dtype);
  }
  Event all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    return inner_->all_gather_bytes(send, recv, bytes);
  }
  Event reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    return inner_->reduce_scatter(send, recv, count, dtype);
  }
  Event all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    return inner_->all_reduce(send, recv, count, dtype);
  }
  Event broadcast(void* buffer, size_t count, DType dtype, int root) override {
    return inner_->broadcast(buffer, count, dtype, root);
  }
  Event barrier() override { return inner_->barrier(); }
  Event all_to_all_bytes(const void* send, void* recv, size_t bytes) override {
    return inner_->all_to_all_bytes(send, recv, bytes);
  }
  Stream& stream() override { return inner_->stream(); }
  const CommCounters& counters() const override { return inner_->counters(); }
  void set_timeout(std::chrono::milliseconds timeout) override { inner_->set_timeout(timeout); }
  void set_desync_check(bool enabled) override { inner_->set_desync_check(enabled); }
  bool desync_check() const override { return inner_->desync_check(); }
  std::string flight_record() const override { return inner_->flight_record(); }
  size_t staging_bytes(CollectiveOp op, size_t count, DType dtype) const override {
    return inner_->staging_bytes(op, count, dtype);
  }
  void set_staging_buffer(void* data, size_t bytes) override {
    inner_->set_staging_buffer(data, bytes);
  }
  void clear_staging_buffer() override { inner_->clear_staging_buffer(); }
  bool reserve_shared(size_t bytes) override { return inner_->reserve_shared(bytes); }
  void* allocate_shared(size_t bytes) override { return inner_->allocate_shared(bytes); }
  bool free_shared(void* data) noexcept override { return inner_->free_shared(data); }
  uint64_t direct_collectives() const override { return inner_->direct_collectives(); }
  uint64_t peer_memory_mapped_bytes() const override { return inner_->peer_memory_mapped_bytes(); }

 protected:
  Communicator& inner() { return *inner_; }

 private:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace zero::testing
