#include "models/gpt2_spill.h"

#include <algorithm>
#include <utility>

#include "zero/core/check.h"

namespace zero::models {

Gpt2CheckpointSpill::Gpt2CheckpointSpill(std::string dir, const AioConfig& aio, int rank,
                                         int checkpoints, int generations)
    : path_(std::move(dir) + "/activations_rank_" + std::to_string(rank) + ".bin"),
      aio_(aio),
      rank_(rank),
      checkpoints_(checkpoints),
      generations_(generations) {
  ZERO_CHECK(
      generations >= 1,
      "the checkpoint spill keeps at least 1 generation of checkpoints, not " << generations);
}

void Gpt2CheckpointSpill::prepare(uint64_t bytes) {
  const uint64_t region = nvme_align_up(bytes);
  if (region == region_) return;
  file_.reset();  // its space back before the new one reserves its own
  region_ = region;
  const uint64_t regions =
      static_cast<uint64_t>(checkpoints_) * static_cast<uint64_t>(generations_);
  file_ = std::make_unique<NvmeFile>(path_, region * regions, aio_, rank_);
  written_by_.assign(regions, 0);
}

size_t Gpt2CheckpointSpill::buffer_floats() const {
  const uint64_t regions = std::min(2, checkpoints_);
  return (regions * region_ + kNvmeBufferSlack) / sizeof(float);
}

float* Gpt2CheckpointSpill::in_buffer(Tensor& buffer, int slot) const {
  // Consecutive checkpointed blocks take alternate halves: in backward a block's and the one it
  // reads ahead for are neighbours.
  const uint64_t half = static_cast<uint64_t>(slot % std::min(2, checkpoints_));
  return reinterpret_cast<float*>(nvme_aligned(buffer.data()) + half * region_);
}

size_t Gpt2CheckpointSpill::region_index(int slot, uint64_t forward) const {
  return static_cast<size_t>(slot) * static_cast<size_t>(generations_) +
         static_cast<size_t>(forward % static_cast<uint64_t>(generations_));
}

NvmeFile::Ticket Gpt2CheckpointSpill::write(const float* data, int slot, uint64_t forward) {
  const size_t region = region_index(slot, forward);
  written_by_[region] = forward + 1;
  traffic_.write_bytes += region_;
  return file_->write(data, region * region_, region_);
}

NvmeFile::Ticket Gpt2CheckpointSpill::read(float* data, int slot, uint64_t forward) {
  const size_t region = region_index(slot, forward);
  ZERO_CHECK(written_by_[region] == forward + 1,
             "the checkpoint of forward "
                 << forward << " of checkpointed block " << slot << " in " << path_
                 << " was overwritten before its backward: more "
                    "micro-batches in flight than its "
                 << generations_ << " generation(s), or backward out of forward order");
  traffic_.read_bytes += region_;
  return file_->read(data, region * region_, region_);
}

void Gpt2CheckpointSpill::wait(const NvmeFile::Ticket& transfer) {
  file_->wait(transfer);
}

Gpt2SpillTraffic Gpt2CheckpointSpill::take_traffic() {
  return std::exchange(traffic_, Gpt2SpillTraffic{});
}

}  // namespace zero::models
