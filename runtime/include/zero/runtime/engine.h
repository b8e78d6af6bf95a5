// The ZeRO engine: owns the layout and the buffers of the chosen stage, and exposes the
// primitives every schedule is built from:
//
//   prefetch(u) / gather(u)  make unit u's full parameters available (stage 3 all-gathers into
//                            a pooled buffer; stages 1-2 wait for the post-step all-gather)
//   release(u)               stage 3: give the gathered buffer back once compute is done
//   grads_ready(u)           unit u's backward for this micro-batch is complete: reduce now
//                            (stage 0 on the last micro-batch, stages 2-3 every micro-batch)
//   step()                   finish reductions, global-norm clip, update each rank's shard
//
// Stage by stage (fp32 working dtype, Ψ padded parameters, N ranks):
//   0: full params, full grads, full Adam state         16Ψ    all-reduce grads
//   1: full params, full grads, Adam state of the shard  8Ψ+8Ψ/N   reduce-scatter at step,
//                                                                  all-gather params after it
//   2: full params, grad shard, Adam state of the shard  4Ψ+12Ψ/N  reduce-scatter per unit in
//                                                                  backward, all-gather after
//   3: param shard, grad shard, Adam state of the shard  16Ψ/N     all-gather before forward
//                                                                  and backward, reduce-scatter
// Collectives run on the communicator's stream; the engine joins it to compute with events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/init.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/memory.h"

namespace zero {

struct EngineConfig {
  int stage = 3;
  int micro_batches = 1;           // gradient accumulation steps per optimizer step
  float gradient_clipping = 0.0f;  // max global norm; 0 turns clipping off
  OptimizerConfig optimizer;       // optimizer.lr is the learning rate of a constant schedule
  LrScheduleConfig lr_schedule;    // any other schedule sets the rate of each step itself
  size_t merge_bytes = 0;          // see LayoutOptions::merge_bytes
  size_t alignment_bytes = 64;
  int kernel_threads = 1;
  uint64_t seed = 1;
};

struct ParamDecl {
  ParamSpec spec;
  ParamInit init;
};

struct StepStats {
  long step = 0;           // optimizer steps taken so far (1 after the first)
  float grad_norm = 0.0f;  // global norm of the averaged gradient, before clipping
  float lr = 0.0f;
  bool clipped = false;
};

class Engine {
 public:
  // Builds the layout, checks that every rank registered the same model (an error names the
  // first parameter that differs), allocates the stage's buffers and initializes parameters.
  Engine(Communicator& comm, const std::vector<ParamDecl>& params, const EngineConfig& config);
  // Waits for collectives still in flight (their buffers are about to be freed).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Layout& layout() const;
  const EngineConfig& config() const;
  Communicator& communicator();
  Allocator& allocator();

  void prefetch(int unit);
  void gather(int unit);
  void release(int unit);
  void grads_ready(int unit);
  StepStats step();

  // The full parameter of registration index `param` (valid while its unit is gathered).
  float* param(int param);
  // Where backward accumulates the gradient of `param` for the current micro-batch (adds, as
  // PyTorch's .grad does). Valid from the unit's gather in backward until grads_ready.
  float* grad(int param);

  // Model-state bytes on this rank (params, grads, master, optimizer state) and the pooled
  // communication/prefetch buffers, as the allocator counts them.
  uint64_t model_state_bytes() const;
  uint64_t buffer_bytes() const;

  // Copies the full fp32 parameters (registration order, unpadded) into out; collective: every
  // rank must call it. Used by tests and exports.
  std::vector<std::vector<float>> gather_full_params();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// All-gathers one 64-bit value from every rank (the Communicator moves typed elements; eight
// bytes travel as four 2-byte elements, with no arithmetic on them).
std::vector<uint64_t> all_gather_u64(Communicator& comm, uint64_t value);

}  // namespace zero
