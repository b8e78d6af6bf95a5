#include "benchmarks/synthetic_tokens.h"

#include <utility>

namespace zero::bench {

namespace {

// splitmix64: a well-mixed 64-bit hash, so neighbouring positions get unrelated tokens.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Tensor synthetic_batch(int vocab_size, int seq_len, uint64_t seed, long step, int64_t first,
                       int64_t count, models::Gpt2Targets& targets) {
  const int T = seq_len;
  Tensor tokens({count, T});
  targets.ids.resize(static_cast<size_t>(count * T));
  float* in = tokens.data();
  for (int64_t s = 0; s < count; ++s) {
    const uint64_t sequence = mix(
        seed ^ mix(static_cast<uint64_t>(step) * 1000003ull + static_cast<uint64_t>(first + s)));
    for (int t = 0; t <= T; ++t) {
      const auto id = static_cast<int32_t>(mix(sequence + static_cast<uint64_t>(t)) %
                                           static_cast<uint64_t>(vocab_size));
      if (t < T) in[s * T + t] = static_cast<float>(id);
      if (t > 0) targets.ids[static_cast<size_t>(s * T + t - 1)] = id;
    }
  }
  return tokens;
}

SyntheticSource::SyntheticSource(int vocab_size, int seq_len, uint64_t seed,
                                 std::shared_ptr<models::Gpt2Targets> targets)
    : vocab_size_(vocab_size), seq_len_(seq_len), seed_(seed), targets_(std::move(targets)) {}

Tensor SyntheticSource::input(long step, int64_t first, int64_t count) {
  return synthetic_batch(vocab_size_, seq_len_, seed_, step, first, count, *targets_);
}

float SyntheticSource::loss(const Tensor& output, Tensor& grad) {
  grad = Tensor({1}, {1.0f}, output.device());
  return output.to_host()[0];
}

}  // namespace zero::bench
