// Pipeline-parallel schedules as data: for each rank (a pipeline stage) the ordered list of what
// it does in one optimizer step: forwards, backwards (whole, or split into the input gradient and
// the weight gradient as zero-bubble schedules do) and the sends and receives between
// neighbouring stages. One executor (pipeline_executor.h) runs any of them; the checks, the timed
// simulation and the formulas here need no MPI. docs/pipeline.md describes the schedules.
#pragma once

#include <string>
#include <vector>

namespace zero {

enum class PipelineScheduleKind { kGpipe, kOneFOneB, kInterleaved, kZeroBubbleH1 };

// "gpipe" | "1f1b" | "interleaved" | "zb-h1"; a zero::Error listing the names otherwise.
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);
const char* pipeline_schedule_name(PipelineScheduleKind kind);

// The ways a model is cut into pipeline stages (pipeline.partition, --pp-partition), as the
// GPT-2 implements them (models/gpt2.h): "parameters", "uniform", "flops" or "type:REGEX" (a
// regular expression after the colon). Their names for messages: kPipelinePartitionMethods.
bool is_pipeline_partition_method(const std::string& method);
constexpr const char* kPipelinePartitionMethods = "parameters, uniform, flops or type:REGEX";

struct PipelineAction {
  enum Kind {
    kForward,
    kBackward,  // the input and the weight gradient together
    kBackwardInput,
    kBackwardWeight,
    kReceiveActivation,
    kSendActivation,
    kReceiveGradient,
    kSendGradient
  };
  Kind kind;
  int micro_batch;
  int chunk;  // the rank's model chunk (0 unless interleaved); virtual stage = chunk * stages +
              // stage

  bool operator==(const PipelineAction& other) const {
    return kind == other.kind && micro_batch == other.micro_batch && chunk == other.chunk;
  }
  bool operator!=(const PipelineAction& other) const { return !(*this == other); }
};

// "forward", "backward", "backward_input", "backward_weight", "receive_activation",
// "send_activation", "receive_gradient", "send_gradient".
const char* pipeline_action_name(PipelineAction::Kind kind);
// "F3.1": the kind's letter (F, B, I for the input gradient, W, then rA, sA, rG, sG for the
// transfers), the micro-batch, and ".chunk" when the chunk is not 0.
std::string pipeline_action_label(const PipelineAction& action);
// True for forward and the backwards; false for the transfers.
bool is_pipeline_compute(PipelineAction::Kind kind);

// The stage a transfer action of `stage` talks to: the previous virtual stage for a receive of
// an activation or a send of a gradient, the next one otherwise (across the last stage to stage 0
// of the next chunk when interleaved).
int pipeline_peer(const PipelineAction& action, int stage, int stages);

// Per rank (= pipeline stage 0..stages-1), the ordered actions of one optimizer step. A receive
// comes right before the compute that consumes it, a send right after the compute that produces
// it; the first virtual stage receives no activation, the last neither sends an activation nor
// receives a gradient. Bad arguments are a zero::Error naming the value: stages, micro_batches or
// virtual_stages below 1, virtual_stages other than 1 for a schedule without chunks, interleaved
// with fewer than 2 virtual stages or with micro_batches not a multiple of stages (as Megatron).
std::vector<std::vector<PipelineAction>> make_pipeline_schedule(PipelineScheduleKind kind,
                                                                int stages, int micro_batches,
                                                                int virtual_stages = 1);

// Proves the lists runnable, or throws a zero::Error naming the first problem (rank, action):
// every action's micro-batch and chunk in range; every micro-batch runs forward and either one
// backward or one backward_input then one backward_weight, exactly once per chunk; each compute
// after what it consumes (its own forward, the received activation or gradient, backward_input
// before backward_weight); each send after the compute that produced it and each receive before
// the compute that consumes it; every send matched by exactly one receive of the same micro-batch
// and chunk on the peer and the reverse. It then runs the lists with the executor's semantics:
// a send never blocks (the executor posts it and waits for it only when the step ends), a
// receive blocks until the peer has posted the matching send; a set of lists where every rank is
// blocked is a deadlock, reported with each rank's blocked action.
void check_pipeline_schedule(const std::vector<std::vector<PipelineAction>>& schedules, int stages,
                             int micro_batches, int virtual_stages = 1);

// Durations of one chunk's computations (any unit); a fused backward takes backward + weight.
struct PipelineDurations {
  double forward = 1.0;
  double backward = 1.0;  // the input gradient
  double weight = 1.0;    // the weight gradient
};

// When each compute action runs if every rank starts at 0, runs its list in order, each compute
// starting as soon as its rank is free and its input has arrived (transfers take no time).
struct PlannedAction {
  PipelineAction action;
  double start;
  double end;
};
// Per rank its compute actions with their planned times; the lists must pass
// check_pipeline_schedule.
std::vector<std::vector<PlannedAction>> simulate_pipeline_schedule(
    const std::vector<std::vector<PipelineAction>>& schedules, int stages,
    const PipelineDurations& durations);
// The idle fraction of rank time of a simulated timeline: 1 - work / (stages * makespan).
double simulated_bubble_fraction(const std::vector<std::vector<PlannedAction>>& timeline);

// The idle fraction of rank time (idle / (stages * step time)) the schedule's formula gives, with
// F, B, W the whole stage's forward, input-gradient and weight-gradient times (interleaved runs
// each chunk at 1/v of them). GPipe and 1F1B: (p-1)/(m+p-1). Interleaved: (p-1)/(v*m+p-1).
// ZB-H1: an idle time of (p-1)(B + max(F-W, 0)) per rank (the paper's (p-1)(F+B-W) when W <= F,
// a third of 1F1B's when F = B = W) over m(F+B+W) of work. Arguments as make_pipeline_schedule;
// durations must be positive (weight_ms may be 0).
double pipeline_bubble_formula(PipelineScheduleKind kind, int stages, int micro_batches,
                               int virtual_stages, double forward_ms, double backward_ms,
                               double weight_ms);

// The most micro-batches stage `stage` holds activations for at once: forwards run whose input
// gradient (backward or backward_input) has not. GPipe m; 1F1B and ZB-H1 min(p - s, m) (ZB-H1's
// deferred weight gradients hold only what W needs); interleaved counts (micro-batch, chunk)
// pairs, each a 1/v share of the stage, as Megatron's warm-up gives: min(2(p-s-1) + (v-1)p + 1,
// v*m), or v*m when m = p (all forwards first).
int pipeline_micro_batches_in_flight(PipelineScheduleKind kind, int stages, int stage,
                                     int micro_batches, int virtual_stages = 1);

// What stage `stage` holds at one point of its list: micro-batches (or, interleaved, (micro-batch,
// chunk) pairs) whose forward ran and whose input gradient has not (`forwarded`), and those whose
// backward_input ran and whose backward_weight has not (`awaiting_weight`); `in_backward_input`:
// the point is inside a backward_input, whose micro-batch is counted as awaiting already. A model
// whose weight half keeps more than W needs (the GPT-2 keeps a micro-batch's activations until
// then) plans its peak over every point.
struct PipelineStageLoad {
  int forwarded = 0;
  int awaiting_weight = 0;
  bool in_backward_input = false;
};
// The load after every compute action of the stage's list, and inside every backward_input.
// Arguments as make_pipeline_schedule, and stage as pipeline_micro_batches_in_flight.
std::vector<PipelineStageLoad> pipeline_stage_loads(PipelineScheduleKind kind, int stages,
                                                    int stage, int micro_batches,
                                                    int virtual_stages = 1);

}  // namespace zero
