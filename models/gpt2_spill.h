// The NVMe spill of the GPT-2's activation checkpoints (ours: Gpt2Checkpointing::nvme_path;
// gpt2_memory.h has its formula). Private to models/.
//
// The checkpointed blocks' inputs live in one file per rank, G regions of R bytes (a checkpoint
// rounded up to kNvmeAlignment) per checkpointed block, through the runtime's NvmeFile (io_uring,
// O_DIRECT, the engine's aio settings). In memory they pass through one buffer of two regions:
// in forward a block copies its input into its half, starts the write and computes on it, and
// waits for the write before the next block starts (so the buffer is free for it); in backward a
// block waits for its checkpoint's read, starts the read of the checkpoint the next block in
// backward order needs into the other half, and recomputes from its own. Nothing is in flight
// between one block's forward or one chunk's backward and the next, so the micro-batches of a
// pipeline stage share the buffer.
//
// The G generations (Gpt2Checkpointing::checkpoint_generations; 1 without a pipeline) give each
// micro-batch a pipeline stage holds in flight regions of its own: a block's forward number k
// (counted from 0) writes generation k mod G. Every schedule zero-train runs with checkpointing
// takes each chunk's micro-batches backward in the order they went forward, so with at most G of
// them in flight, forward k - G has read its checkpoint back by forward k. Round robin rather
// than a free list: a forward that no backward follows (validation) has nothing to hand back.
// Each region remembers the forward that wrote it last, so a checkpoint overwritten before its
// backward is an error, never a wrong gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt2_memory.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/model.h"
#include "zero/runtime/nvme_file.h"

namespace zero::models {

class Gpt2CheckpointSpill {
 public:
  // `checkpoints`: the checkpointed blocks, `generations` regions each. Makes nothing yet: the
  // regions' size is the first micro-batch's.
  Gpt2CheckpointSpill(std::string dir, const AioConfig& aio, int rank, int checkpoints,
                      int generations = 1);

  // Checkpoints of `bytes` each from now on: the file is made again (its space reserved and
  // checked, the old one closed first) when their region changes, which loses the checkpoints
  // in flight (their reads are refused). Nothing may be transferring.
  void prepare(uint64_t bytes);
  // Floats of the buffer the checkpoints pass through, for the size prepared.
  size_t buffer_floats() const;
  // Where checkpoint `slot` (its block's place among the checkpointed ones) is in `buffer`.
  float* in_buffer(Tensor& buffer, int slot) const;
  // Start moving checkpoint `slot` of its block's forward number `forward` (counted by the
  // block from 0) between its region and `data` (an in_buffer()). A read of a region another
  // forward wrote since is a zero::Error.
  NvmeFile::Ticket write(const float* data, int slot, uint64_t forward);
  NvmeFile::Ticket read(float* data, int slot, uint64_t forward);
  // Blocks until the transfer is done; its error (file, offset, errno) is thrown.
  void wait(const NvmeFile::Ticket& transfer);

  // Bytes of the file (every checkpoint's regions); 0 before the first prepare.
  uint64_t file_bytes() const { return file_ ? file_->bytes() : 0; }
  Gpt2SpillTraffic take_traffic();

 private:
  // Which region of the file (in regions) holds checkpoint `slot` of forward `forward`.
  size_t region_index(int slot, uint64_t forward) const;

  std::string path_;
  AioConfig aio_;
  int rank_;
  int checkpoints_;
  int generations_;
  uint64_t region_ = 0;
  // Per region (slot-major), 1 + the forward that wrote it last; 0: none since the file was made.
  std::vector<uint64_t> written_by_;
  std::unique_ptr<NvmeFile> file_;
  Gpt2SpillTraffic traffic_;
};

}  // namespace zero::models
