// The NVMe spill of the GPT-2's activation checkpoints (ours: Gpt2Checkpointing::nvme_path;
// gpt2_memory.h has its formula). Private to models/.
//
// The checkpointed blocks' inputs live in one file per rank, a region of R bytes (a checkpoint
// rounded up to kNvmeAlignment) per checkpointed block in forward order, through the runtime's
// NvmeFile (io_uring, O_DIRECT, the engine's aio settings). In memory they pass through one
// buffer of two regions: in forward a block copies its input into its half, starts the write and
// computes on it, and waits for the write before the next block starts (so the buffer is free for
// it); in backward a block waits for its checkpoint's read, starts the read of the checkpoint the
// next block in backward order needs into the other half, and recomputes from its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/gpt2_memory.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/model.h"
#include "zero/runtime/nvme_file.h"

namespace zero::models {

class Gpt2CheckpointSpill {
 public:
  // `checkpoints`: the checkpointed blocks, one region each. Makes nothing yet: the regions'
  // size is the first micro-batch's.
  Gpt2CheckpointSpill(std::string dir, const AioConfig& aio, int rank, int checkpoints);

  // Checkpoints of `bytes` each from now on: the file is made again (its space reserved and
  // checked, the old one closed first) when their region changes. Nothing may be in flight.
  void prepare(uint64_t bytes);
  // Floats of the buffer the checkpoints pass through, for the size prepared.
  size_t buffer_floats() const;
  // Where checkpoint `slot` (its block's place among the checkpointed ones) is in `buffer`.
  float* in_buffer(Tensor& buffer, int slot) const;
  // Start moving checkpoint `slot`'s region between the file and `data` (an in_buffer()).
  NvmeFile::Ticket write(const float* data, int slot);
  NvmeFile::Ticket read(float* data, int slot);
  // Blocks until the transfer is done; its error (file, offset, errno) is thrown.
  void wait(const NvmeFile::Ticket& transfer);

  // Bytes of the file (every checkpoint's region); 0 before the first prepare.
  uint64_t file_bytes() const { return file_ ? file_->bytes() : 0; }
  Gpt2SpillTraffic take_traffic();

 private:
  std::string path_;
  AioConfig aio_;
  int rank_;
  int checkpoints_;
  uint64_t region_ = 0;
  std::unique_ptr<NvmeFile> file_;
  Gpt2SpillTraffic traffic_;
};

}  // namespace zero::models
