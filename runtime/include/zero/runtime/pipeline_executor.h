// One executor for every pipeline schedule (pipeline_schedule.h): it runs one rank's list of
// actions, calling the rank's PipelineStageWork for the computations and moving activations and
// their gradients between neighbouring stages over a PeerChannel. Transfers overlap compute:
// receives are posted ahead of the action that names them, sends are waited for only when the
// step ends. docs/pipeline.md describes its semantics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/collectives/peer_channel.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/model.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero {

// What one rank computes for its chunk(s). Tensors are host-memory zero::Tensors.
class PipelineStageWork {
 public:
  virtual ~PipelineStageWork() = default;
  // Forward of micro-batch mb on chunk c. input: the activation received (an empty Tensor on the
  // first virtual stage); the callee keeps what its backward needs (input is reused after the
  // call). output: written by the callee, shape = activation_shape (ignored on the last virtual
  // stage).
  virtual void forward(int micro_batch, int chunk, const Tensor& input, Tensor& output) = 0;
  // Backward of mb on c (input and weight gradients). grad_output: received (empty on the last
  // virtual stage); grad_input: written (ignored on the first virtual stage).
  virtual void backward(int micro_batch, int chunk, const Tensor& grad_output,
                        Tensor& grad_input) = 0;
  // ZB-H1: the input gradient only, then later the weight gradient. The defaults throw a
  // zero::Error saying the work does not split backward.
  virtual bool splits_backward() const { return false; }
  virtual void backward_input(int micro_batch, int chunk, const Tensor& grad_output,
                              Tensor& grad_input);
  virtual void backward_weight(int micro_batch, int chunk);
};

// DeepSpeed's pipe_partitioned and grad_partitioned. Under tensor parallelism every rank of a
// tensor-parallel group holds the same activation (and gradient) between stages. Partitioned,
// each rank sends only its 1/t slice to its peer in the neighbouring stage, and the receiving
// group all-gathers the whole tensor back: the same numbers, 1/t of the bytes between stages,
// and an all-gather inside the group per received tensor.
struct PipelineSlicing {
  // What crosses a stage boundary: an activation forward or its gradient back.
  enum Boundary { kActivation, kGradient };

  Communicator* tensor_parallel = nullptr;  // the rank's group; null or of 1 rank: whole tensors
  bool activations = true;                  // pipe_partitioned
  bool gradients = true;                    // grad_partitioned

  // Whether tensors of this kind travel as slices.
  bool slices(Boundary kind) const;
  // The floats of a tensor of `numel` this rank sends and receives: [first, first + count).
  // A numel the group does not divide is a zero::Error naming both.
  ElementRange range(Boundary kind, size_t numel) const;
  // The transfers of a tensor of this kind: this rank's range() of `whole`.
  PeerRequest send(PeerChannel& channel, int peer, int tag, const Tensor& whole,
                   Boundary kind) const;
  PeerRequest receive(PeerChannel& channel, int peer, int tag, Tensor& whole, Boundary kind) const;
  // After the receive's wait: the whole tensor, all-gathered over the group (collective over it:
  // every rank of the group calls it for the same tensor in the same order).
  void gather(Boundary kind, Tensor& whole) const;
};

struct PipelineActionTiming {
  PipelineAction action;
  double start_ms;  // since the step's start
  double end_ms;
};

struct PipelineStepReport {
  double step_ms = 0.0;
  double busy_ms = 0.0;  // compute actions
  double wait_ms = 0.0;  // waiting for receives, and for sends at the step's end
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  std::vector<PipelineActionTiming> timeline;  // every action of the list, in order
};

class PipelineExecutor {
 public:
  // activation_shape: the tensor passed between every pair of neighbouring virtual stages, the
  // same for the activation and its gradient. Collective over the channel's ranks: they exchange
  // their shapes, and every rank fails alike naming both shapes when neighbours disagree. The
  // lists (all ranks', as make_pipeline_schedule gives them) must pass check_pipeline_schedule;
  // the channel's size must be `stages` and its rank `stage`. The executor uses the channel's
  // tags from 0 up: give it a channel of its own. `slicing`: which tensors go as slices of the
  // tensor-parallel group (every rank of a group must give the same).
  PipelineExecutor(PeerChannel& channel, int stage, int stages,
                   std::vector<std::vector<PipelineAction>> schedules,
                   std::vector<int64_t> activation_shape, int virtual_stages = 1,
                   PipelineSlicing slicing = {});

  // One step's actions, in order. A list that splits backward (ZB-H1) with work that does not
  // (splits_backward() false) is refused before any action, on every rank alike.
  PipelineStepReport run(PipelineStageWork& work);

  int micro_batches() const { return micro_batches_; }
  const std::vector<std::vector<PipelineAction>>& schedules() const { return schedules_; }

 private:
  int tag_of(const PipelineAction& transfer) const;
  void exchange_shapes();

  PeerChannel& channel_;
  int stage_;
  int stages_;
  int virtual_stages_;
  int micro_batches_ = 0;
  std::vector<std::vector<PipelineAction>> schedules_;
  std::vector<int64_t> activation_shape_;
  PipelineSlicing slicing_;
  std::vector<Tensor> free_buffers_;  // activation-shaped tensors to reuse
};

// Every rank's report on rank 0 (in rank order; empty on the others). Collective over the
// channel's ranks; uses its tag 1.
std::vector<PipelineStepReport> gather_pipeline_reports(PeerChannel& channel,
                                                        const PipelineStepReport& mine);

// Writes PREFIX.json, every rank's measured actions (reports, as gathered) and the planned
// timeline of the compute actions (simulate_pipeline_schedule of `schedules` with `planned`
// durations per chunk): records {rank, action, micro_batch, chunk, timeline: "measured" or
// "planned", start_ms, end_ms}; then PREFIX.gp and, through gnuplot, PREFIX.png: one row per rank,
// one box per compute action coloured by kind (F, B, backward_input, backward_weight), measured
// above planned. Returns "" when all were written, or why the picture was not (gnuplot not on
// PATH: the JSON alone). A file that cannot be written is a zero::Error naming it.
std::string write_pipeline_timeline(const std::string& prefix,
                                    const std::vector<PipelineStepReport>& reports,
                                    const std::vector<std::vector<PipelineAction>>& schedules,
                                    const PipelineDurations& planned = {});

}  // namespace zero
