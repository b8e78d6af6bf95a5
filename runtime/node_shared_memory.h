// Where the engine's collectives' buffers live on the CPU path: in the communicator's
// node-shared memory while it has room, so that its shared-memory collectives run straight on
// them (Communicator::reserve_shared), else in the fallback (the device's host memory).
#pragma once

#include <string>

#include "zero/collectives/communicator.h"
#include "zero/runtime/memory.h"

namespace zero {

class NodeSharedMemory final : public MemoryResource {
 public:
  // Both must outlive this and every buffer it hands out.
  NodeSharedMemory(Communicator& comm, MemoryResource& fallback)
      : comm_(comm), fallback_(fallback) {}

  void* allocate(size_t bytes) override {
    void* shared = comm_.allocate_shared(bytes);
    return shared != nullptr ? shared : fallback_.allocate(bytes);
  }

  void deallocate(void* data, size_t bytes) noexcept override {
    if (!comm_.free_shared(data)) fallback_.deallocate(data, bytes);
  }

  std::string memory_name() const override { return "node-shared " + fallback_.memory_name(); }

 private:
  Communicator& comm_;
  MemoryResource& fallback_;
};

}  // namespace zero
