// Synthetic GPT-2 batches for the benchmarks (zero-bench-gpt2, zero-bench-checkpointing): every
// token id is drawn uniformly from the vocabulary by a hash of (seed, step, sequence, position),
// so no file is needed and every world size sees the same batch; a throughput benchmark does not
// care what the tokens say (the loss stays near ln(vocab)).
#pragma once

#include <cstdint>
#include <memory>

#include "models/gpt2.h"
#include "models/train_step.h"

namespace zero::bench {

// Sequences [first, first + count) of step's global batch: T + 1 tokens each, the first T the
// input (token ids as floats, exact below 2^24), the last T the targets.
Tensor synthetic_batch(int vocab_size, int seq_len, uint64_t seed, long step, int64_t first,
                       int64_t count, models::Gpt2Targets& targets);

// The batches of one model (each model has its own targets, which its loss reads); its output is
// the mean loss, whose gradient with respect to itself is 1.
class SyntheticSource : public models::MicroBatchSource {
 public:
  SyntheticSource(int vocab_size, int seq_len, uint64_t seed,
                  std::shared_ptr<models::Gpt2Targets> targets);
  Tensor input(long step, int64_t first, int64_t count) override;
  float loss(const Tensor& output, Tensor& grad) override;

 private:
  int vocab_size_;
  int seq_len_;
  uint64_t seed_;
  std::shared_ptr<models::Gpt2Targets> targets_;
};

}  // namespace zero::bench
