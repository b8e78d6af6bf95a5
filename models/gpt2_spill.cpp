#include "models/gpt2_spill.h"

#include <algorithm>
#include <utility>

#include "zero/core/check.h"

namespace zero::models {

Gpt2CheckpointSpill::Gpt2CheckpointSpill(std::string dir, const AioConfig& aio, int rank,
                                         int checkpoints)
    : path_(std::move(dir) + "/activations_rank_" + std::to_string(rank) + ".bin"),
      aio_(aio),
      rank_(rank),
      checkpoints_(checkpoints) {}

void Gpt2CheckpointSpill::prepare(uint64_t bytes) {
  const uint64_t region = nvme_align_up(bytes);
  if (region == region_) return;
  file_.reset();  // its space back before the new one reserves its own
  region_ = region;
  file_ =
      std::make_unique<NvmeFile>(path_, region * static_cast<uint64_t>(checkpoints_), aio_, rank_);
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

NvmeFile::Ticket Gpt2CheckpointSpill::write(const float* data, int slot) {
  traffic_.write_bytes += region_;
  return file_->write(data, static_cast<uint64_t>(slot) * region_, region_);
}

NvmeFile::Ticket Gpt2CheckpointSpill::read(float* data, int slot) {
  traffic_.read_bytes += region_;
  return file_->read(data, static_cast<uint64_t>(slot) * region_, region_);
}

void Gpt2CheckpointSpill::wait(const NvmeFile::Ticket& transfer) {
  file_->wait(transfer);
}

Gpt2SpillTraffic Gpt2CheckpointSpill::take_traffic() {
  return std::exchange(traffic_, Gpt2SpillTraffic{});
}

}  // namespace zero::models
