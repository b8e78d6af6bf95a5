// The pipeline schedules (pipeline_schedule.h): each kind's order of computations per rank, the
// transfers put around them, the check and the timed simulation of a set of lists, and the
// formulas. docs/pipeline.md has the schedules' pictures and sources.
#include "zero/runtime/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "zero/core/check.h"

namespace zero {

namespace {

using Kind = PipelineAction::Kind;

// What a message is: an activation or a gradient of one micro-batch, for one receiving virtual
// stage (unique in a step, so it names the message on both sides).
struct MessageKey {
  bool gradient;
  int micro_batch;
  int receiver;  // the receiving virtual stage

  bool operator<(const MessageKey& other) const {
    return std::tie(gradient, micro_batch, receiver) <
           std::tie(other.gradient, other.micro_batch, other.receiver);
  }
};

int virtual_stage(int stage, int chunk, int stages) {
  return chunk * stages + stage;
}

// The message a transfer action of (stage, its chunk) sends or receives.
MessageKey message_of(const PipelineAction& action, int stage, int stages) {
  const int own = virtual_stage(stage, action.chunk, stages);
  switch (action.kind) {
    case PipelineAction::kReceiveActivation:
      return {false, action.micro_batch, own};
    case PipelineAction::kSendActivation:
      return {false, action.micro_batch, own + 1};
    case PipelineAction::kReceiveGradient:
      return {true, action.micro_batch, own};
    case PipelineAction::kSendGradient:
      return {true, action.micro_batch, own - 1};
    default:
      ZERO_FAIL("pipeline action " << pipeline_action_name(action.kind) << " is not a transfer");
  }
}

bool is_receive(Kind kind) {
  return kind == PipelineAction::kReceiveActivation || kind == PipelineAction::kReceiveGradient;
}

bool is_send(Kind kind) {
  return kind == PipelineAction::kSendActivation || kind == PipelineAction::kSendGradient;
}

void check_arguments(PipelineScheduleKind kind, int stages, int micro_batches, int virtual_stages) {
  ZERO_CHECK(stages >= 1, "a pipeline needs at least 1 stage, got " << stages);
  ZERO_CHECK(micro_batches >= 1,
             "a pipeline step needs at least 1 micro-batch, got " << micro_batches);
  ZERO_CHECK(virtual_stages >= 1,
             "virtual stages (model chunks per rank) must be at least 1, got " << virtual_stages);
  if (kind == PipelineScheduleKind::kInterleaved) {
    ZERO_CHECK(virtual_stages >= 2,
               "the interleaved schedule needs at least 2 virtual stages (model chunks) per rank, "
               "got "
                   << virtual_stages);
    ZERO_CHECK(micro_batches % stages == 0,
               "the interleaved schedule needs the micro-batches to be a multiple of the stages "
               "(as Megatron's), got "
                   << micro_batches << " micro-batches for " << stages << " stages");
  } else {
    ZERO_CHECK(virtual_stages == 1, "the " << pipeline_schedule_name(kind)
                                           << " schedule has one model chunk per rank: virtual "
                                              "stages must be 1, got "
                                           << virtual_stages);
  }
}

// A rank's computations in order, with the transfers put around them: a receive right before the
// compute that consumes it, a send right after the compute that produces it.
class ListBuilder {
 public:
  ListBuilder(int stage, int stages, int virtual_stages)
      : stage_(stage), last_(stages * virtual_stages - 1), stages_(stages) {}

  void forward(int micro_batch, int chunk) {
    const int own = virtual_stage(stage_, chunk, stages_);
    if (own > 0) add(PipelineAction::kReceiveActivation, micro_batch, chunk);
    add(PipelineAction::kForward, micro_batch, chunk);
    if (own < last_) add(PipelineAction::kSendActivation, micro_batch, chunk);
  }

  // kBackward or kBackwardInput: both consume the gradient and produce the input's.
  void backward(Kind kind, int micro_batch, int chunk) {
    const int own = virtual_stage(stage_, chunk, stages_);
    if (own < last_) add(PipelineAction::kReceiveGradient, micro_batch, chunk);
    add(kind, micro_batch, chunk);
    if (own > 0) add(PipelineAction::kSendGradient, micro_batch, chunk);
  }

  void weight(int micro_batch, int chunk) {
    add(PipelineAction::kBackwardWeight, micro_batch, chunk);
  }

  std::vector<PipelineAction> take() { return std::move(actions_); }

 private:
  void add(Kind kind, int micro_batch, int chunk) {
    actions_.push_back(PipelineAction{kind, micro_batch, chunk});
  }

  int stage_;
  int last_;
  int stages_;
  std::vector<PipelineAction> actions_;
};

std::vector<PipelineAction> gpipe_list(int stage, int stages, int micro_batches) {
  ListBuilder list(stage, stages, 1);
  for (int mb = 0; mb < micro_batches; ++mb) list.forward(mb, 0);
  for (int mb = 0; mb < micro_batches; ++mb) list.backward(PipelineAction::kBackward, mb, 0);
  return list.take();
}

// PipeDream-Flush as Megatron's non-interleaved schedule: (stages - stage - 1) warm-up forwards,
// then one forward and one backward at a time, then the remaining backwards.
std::vector<PipelineAction> one_f_one_b_list(int stage, int stages, int micro_batches) {
  ListBuilder list(stage, stages, 1);
  const int warmup = std::min(stages - stage - 1, micro_batches);
  for (int mb = 0; mb < warmup; ++mb) list.forward(mb, 0);
  int next_backward = 0;
  for (int mb = warmup; mb < micro_batches; ++mb) {
    list.forward(mb, 0);
    list.backward(PipelineAction::kBackward, next_backward++, 0);
  }
  while (next_backward < micro_batches) {
    list.backward(PipelineAction::kBackward, next_backward++, 0);
  }
  return list.take();
}

// ZB-H1 (Qi et al. 2024): 1F1B's forwards and input gradients (so the same activations in
// flight), each weight gradient deferred until `stage` others are pending, so that stage s keeps
// s of them to fill the cool-down's waits; the last ones run at the end.
std::vector<PipelineAction> zero_bubble_h1_list(int stage, int stages, int micro_batches) {
  ListBuilder list(stage, stages, 1);
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int next_backward = 0;
  int next_weight = 0;
  const auto backward = [&] {
    list.backward(PipelineAction::kBackwardInput, next_backward++, 0);
    if (next_backward - next_weight > stage) list.weight(next_weight++, 0);
  };
  for (int mb = 0; mb < warmup; ++mb) list.forward(mb, 0);
  for (int mb = warmup; mb < micro_batches; ++mb) {
    list.forward(mb, 0);
    backward();
  }
  while (next_backward < micro_batches) backward();
  while (next_weight < micro_batches) list.weight(next_weight++, 0);
  return list.take();
}

// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving): the k-th
// forward of a rank runs chunk (k mod pv) / p of micro-batch (k div pv) p + k mod p, its k-th
// backward the same micro-batch on chunk v - 1 - that; the warm-up is 2(p - s - 1) + (v - 1)p
// forwards, or all of them when m = p.
std::vector<PipelineAction> interleaved_list(int stage, int stages, int micro_batches,
                                             int virtual_stages) {
  ListBuilder list(stage, stages, virtual_stages);
  const int total = micro_batches * virtual_stages;
  const int group = stages * virtual_stages;
  const auto micro_batch = [&](int k) { return (k / group) * stages + k % stages; };
  const auto forward_chunk = [&](int k) { return (k % group) / stages; };
  const auto backward_chunk = [&](int k) { return virtual_stages - 1 - (k % group) / stages; };
  int warmup = total;
  if (micro_batches != stages) {
    warmup = std::min(2 * (stages - stage - 1) + (virtual_stages - 1) * stages, total);
  }
  for (int k = 0; k < warmup; ++k) list.forward(micro_batch(k), forward_chunk(k));
  int next_backward = 0;
  for (int k = warmup; k < total; ++k) {
    list.forward(micro_batch(k), forward_chunk(k));
    list.backward(PipelineAction::kBackward, micro_batch(next_backward),
                  backward_chunk(next_backward));
    ++next_backward;
  }
  for (; next_backward < total; ++next_backward) {
    list.backward(PipelineAction::kBackward, micro_batch(next_backward),
                  backward_chunk(next_backward));
  }
  return list.take();
}

std::string describe(int rank, size_t index, const PipelineAction& action) {
  std::ostringstream out;
  out << "rank " << rank << " action " << index << " (" << pipeline_action_name(action.kind)
      << " of micro-batch " << action.micro_batch << ", chunk " << action.chunk << ")";
  return out.str();
}

// What one rank has done with one (micro-batch, chunk) so far.
struct UnitProgress {
  bool activation_received = false;
  bool forward = false;
  bool activation_sent = false;
  bool gradient_received = false;
  Kind backward = PipelineAction::kForward;  // kForward: no backward yet
  bool weight = false;
  bool gradient_sent = false;
};

void check_rank_list(const std::vector<PipelineAction>& list, int rank, int stages,
                     int micro_batches, int virtual_stages) {
  const int last = stages * virtual_stages - 1;
  std::vector<UnitProgress> units(static_cast<size_t>(micro_batches) *
                                  static_cast<size_t>(virtual_stages));
  for (size_t i = 0; i < list.size(); ++i) {
    const PipelineAction& a = list[i];
    ZERO_CHECK(
        a.kind >= PipelineAction::kForward && a.kind <= PipelineAction::kSendGradient,
        "rank " << rank << " action " << i << " has an unknown kind " << static_cast<int>(a.kind));
    const std::string where = describe(rank, i, a);
    ZERO_CHECK(a.micro_batch >= 0 && a.micro_batch < micro_batches,
               where << ": the micro-batch is outside 0.." << micro_batches - 1);
    ZERO_CHECK(a.chunk >= 0 && a.chunk < virtual_stages,
               where << ": the chunk is outside 0.." << virtual_stages - 1);
    UnitProgress& u = units[static_cast<size_t>(a.micro_batch) * virtual_stages + a.chunk];
    const int own = virtual_stage(rank, a.chunk, stages);
    switch (a.kind) {
      case PipelineAction::kReceiveActivation:
        ZERO_CHECK(own > 0, where << ": the first virtual stage receives no activation");
        ZERO_CHECK(!u.activation_received, where << ": received twice");
        u.activation_received = true;
        break;
      case PipelineAction::kForward:
        ZERO_CHECK(!u.forward, where << ": runs twice");
        ZERO_CHECK(own == 0 || u.activation_received,
                   where << ": runs before its activation is received");
        u.forward = true;
        break;
      case PipelineAction::kSendActivation:
        ZERO_CHECK(own < last, where << ": the last virtual stage sends no activation");
        ZERO_CHECK(u.forward, where << ": sends before the forward that produces it");
        ZERO_CHECK(!u.activation_sent, where << ": sent twice");
        u.activation_sent = true;
        break;
      case PipelineAction::kReceiveGradient:
        ZERO_CHECK(own < last, where << ": the last virtual stage receives no gradient");
        ZERO_CHECK(!u.gradient_received, where << ": received twice");
        u.gradient_received = true;
        break;
      case PipelineAction::kBackward:
      case PipelineAction::kBackwardInput:
        ZERO_CHECK(u.forward, where << ": runs before its forward");
        ZERO_CHECK(u.backward == PipelineAction::kForward, where << ": a second backward");
        ZERO_CHECK(own == last || u.gradient_received,
                   where << ": runs before its gradient is received");
        u.backward = a.kind;
        break;
      case PipelineAction::kBackwardWeight:
        ZERO_CHECK(u.backward == PipelineAction::kBackwardInput,
                   where << ": runs without a backward_input before it");
        ZERO_CHECK(!u.weight, where << ": runs twice");
        u.weight = true;
        break;
      case PipelineAction::kSendGradient:
        ZERO_CHECK(own > 0, where << ": the first virtual stage sends no gradient");
        ZERO_CHECK(u.backward != PipelineAction::kForward,
                   where << ": sends before the backward that produces it");
        ZERO_CHECK(!u.gradient_sent, where << ": sent twice");
        u.gradient_sent = true;
        break;
    }
  }
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (int chunk = 0; chunk < virtual_stages; ++chunk) {
      const UnitProgress& u = units[static_cast<size_t>(mb) * virtual_stages + chunk];
      const int own = virtual_stage(rank, chunk, stages);
      std::ostringstream where;
      where << "rank " << rank << ", micro-batch " << mb << ", chunk " << chunk;
      ZERO_CHECK(u.forward, where.str() << ": no forward");
      ZERO_CHECK(u.backward != PipelineAction::kForward, where.str() << ": no backward");
      ZERO_CHECK(u.backward == PipelineAction::kBackward || u.weight,
                 where.str() << ": backward_input without its backward_weight");
      ZERO_CHECK(own == 0 || (u.activation_received && u.gradient_sent),
                 where.str() << ": the activation is not received or the gradient not sent");
      ZERO_CHECK(own == last || (u.activation_sent && u.gradient_received),
                 where.str() << ": the activation is not sent or the gradient not received");
    }
  }
}

int checked_stage_count(const std::vector<std::vector<PipelineAction>>& schedules, int stages) {
  ZERO_CHECK(stages >= 1, "a pipeline needs at least 1 stage, got " << stages);
  ZERO_CHECK(schedules.size() == static_cast<size_t>(stages),
             "a pipeline of " << stages << " stages needs " << stages << " action lists, got "
                              << schedules.size());
  return stages;
}

}  // namespace

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineScheduleKind::kGpipe;
  if (name == "1f1b") return PipelineScheduleKind::kOneFOneB;
  if (name == "interleaved") return PipelineScheduleKind::kInterleaved;
  if (name == "zb-h1") return PipelineScheduleKind::kZeroBubbleH1;
  ZERO_FAIL("unknown pipeline schedule '" << name
                                          << "': expected gpipe, 1f1b, interleaved or zb-h1");
}

bool is_pipeline_partition_method(const std::string& method) {
  const bool by_type = method.rfind("type:", 0) == 0 && method.size() > 5;
  return method == "parameters" || method == "uniform" || method == "flops" || by_type;
}

const char* pipeline_schedule_name(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::kGpipe:
      return "gpipe";
    case PipelineScheduleKind::kOneFOneB:
      return "1f1b";
    case PipelineScheduleKind::kInterleaved:
      return "interleaved";
    case PipelineScheduleKind::kZeroBubbleH1:
      return "zb-h1";
  }
  return "unknown";
}

const char* pipeline_action_name(PipelineAction::Kind kind) {
  switch (kind) {
    case PipelineAction::kForward:
      return "forward";
    case PipelineAction::kBackward:
      return "backward";
    case PipelineAction::kBackwardInput:
      return "backward_input";
    case PipelineAction::kBackwardWeight:
      return "backward_weight";
    case PipelineAction::kReceiveActivation:
      return "receive_activation";
    case PipelineAction::kSendActivation:
      return "send_activation";
    case PipelineAction::kReceiveGradient:
      return "receive_gradient";
    case PipelineAction::kSendGradient:
      return "send_gradient";
  }
  return "unknown";
}

std::string pipeline_action_label(const PipelineAction& action) {
  static const char* const kLetters[] = {"F", "B", "I", "W", "rA", "sA", "rG", "sG"};
  std::string label = kLetters[action.kind] + std::to_string(action.micro_batch);
  if (action.chunk != 0) label += "." + std::to_string(action.chunk);
  return label;
}

bool is_pipeline_compute(PipelineAction::Kind kind) {
  return kind == PipelineAction::kForward || kind == PipelineAction::kBackward ||
         kind == PipelineAction::kBackwardInput || kind == PipelineAction::kBackwardWeight;
}

int pipeline_peer(const PipelineAction& action, int stage, int stages) {
  const bool upstream = action.kind == PipelineAction::kReceiveActivation ||
                        action.kind == PipelineAction::kSendGradient;
  ZERO_CHECK(upstream || action.kind == PipelineAction::kSendActivation ||
                 action.kind == PipelineAction::kReceiveGradient,
             "pipeline action " << pipeline_action_name(action.kind) << " has no peer");
  return upstream ? (stage + stages - 1) % stages : (stage + 1) % stages;
}

std::vector<std::vector<PipelineAction>> make_pipeline_schedule(PipelineScheduleKind kind,
                                                                int stages, int micro_batches,
                                                                int virtual_stages) {
  check_arguments(kind, stages, micro_batches, virtual_stages);
  std::vector<std::vector<PipelineAction>> lists;
  for (int stage = 0; stage < stages; ++stage) {
    switch (kind) {
      case PipelineScheduleKind::kGpipe:
        lists.push_back(gpipe_list(stage, stages, micro_batches));
        break;
      case PipelineScheduleKind::kOneFOneB:
        lists.push_back(one_f_one_b_list(stage, stages, micro_batches));
        break;
      case PipelineScheduleKind::kInterleaved:
        lists.push_back(interleaved_list(stage, stages, micro_batches, virtual_stages));
        break;
      case PipelineScheduleKind::kZeroBubbleH1:
        lists.push_back(zero_bubble_h1_list(stage, stages, micro_batches));
        break;
    }
  }
  return lists;
}

void check_pipeline_schedule(const std::vector<std::vector<PipelineAction>>& schedules, int stages,
                             int micro_batches, int virtual_stages) {
  checked_stage_count(schedules, stages);
  ZERO_CHECK(micro_batches >= 1,
             "a pipeline step needs at least 1 micro-batch, got " << micro_batches);
  ZERO_CHECK(virtual_stages >= 1,
             "virtual stages (model chunks per rank) must be at least 1, got " << virtual_stages);
  for (int rank = 0; rank < stages; ++rank) {
    check_rank_list(schedules[static_cast<size_t>(rank)], rank, stages, micro_batches,
                    virtual_stages);
  }
  // Each rank's list is complete, so every message has one send and one receive; now run them:
  // sends post at once, a receive waits until its message has been sent.
  std::map<MessageKey, bool> sent;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < stages; ++rank) {
      const auto& list = schedules[static_cast<size_t>(rank)];
      size_t& i = next[static_cast<size_t>(rank)];
      for (; i < list.size(); ++i, progress = true) {
        const PipelineAction& a = list[i];
        if (is_send(a.kind)) sent[message_of(a, rank, stages)] = true;
        if (is_receive(a.kind) && sent.count(message_of(a, rank, stages)) == 0) break;
      }
    }
  }
  std::ostringstream blocked;
  for (int rank = 0; rank < stages; ++rank) {
    const auto& list = schedules[static_cast<size_t>(rank)];
    const size_t i = next[static_cast<size_t>(rank)];
    if (i < list.size()) {
      blocked << (blocked.tellp() > 0 ? "; " : "") << describe(rank, i, list[i])
              << " waits for stage " << pipeline_peer(list[i], rank, stages);
    }
  }
  ZERO_CHECK(blocked.str().empty(), "the pipeline schedule deadlocks: " << blocked.str());
}

std::vector<std::vector<PlannedAction>> simulate_pipeline_schedule(
    const std::vector<std::vector<PipelineAction>>& schedules, int stages,
    const PipelineDurations& durations) {
  checked_stage_count(schedules, stages);
  std::map<MessageKey, double> sent_at;  // when the producing compute ended
  std::vector<std::map<MessageKey, double>> arrived(static_cast<size_t>(stages));
  std::vector<double> clock(static_cast<size_t>(stages), 0.0);
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<std::vector<PlannedAction>> timeline(static_cast<size_t>(stages));
  const auto duration = [&](Kind kind) {
    switch (kind) {
      case PipelineAction::kForward:
        return durations.forward;
      case PipelineAction::kBackward:
        return durations.backward + durations.weight;
      case PipelineAction::kBackwardInput:
        return durations.backward;
      default:
        return durations.weight;
    }
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < stages; ++rank) {
      const auto r = static_cast<size_t>(rank);
      const auto& list = schedules[r];
      for (size_t& i = next[r]; i < list.size(); ++i, progress = true) {
        const PipelineAction& a = list[i];
        if (is_send(a.kind)) {
          sent_at[message_of(a, rank, stages)] = clock[r];
        } else if (is_receive(a.kind)) {
          const MessageKey key = message_of(a, rank, stages);
          const auto found = sent_at.find(key);
          if (found == sent_at.end()) break;
          arrived[r][key] = found->second;
        } else {
          double start = clock[r];
          const int own = virtual_stage(rank, a.chunk, stages);
          // The input this compute consumes, if it came from a neighbour.
          const bool takes_activation = a.kind == PipelineAction::kForward;
          const bool takes_gradient =
              a.kind == PipelineAction::kBackward || a.kind == PipelineAction::kBackwardInput;
          if (takes_activation || takes_gradient) {
            const auto input = arrived[r].find({takes_gradient, a.micro_batch, own});
            if (input != arrived[r].end()) start = std::max(start, input->second);
          }
          clock[r] = start + duration(a.kind);
          timeline[r].push_back({a, start, clock[r]});
        }
      }
    }
  }
  for (int rank = 0; rank < stages; ++rank) {
    const auto r = static_cast<size_t>(rank);
    ZERO_CHECK(next[r] == schedules[r].size(), "the pipeline schedule deadlocks at "
                                                   << describe(rank, next[r], schedules[r][next[r]])
                                                   << " (check_pipeline_schedule says more)");
  }
  return timeline;
}

double simulated_bubble_fraction(const std::vector<std::vector<PlannedAction>>& timeline) {
  double makespan = 0.0;
  double work = 0.0;
  for (const auto& rank : timeline) {
    for (const PlannedAction& a : rank) {
      makespan = std::max(makespan, a.end);
      work += a.end - a.start;
    }
  }
  if (makespan <= 0.0) return 0.0;
  return 1.0 - work / (static_cast<double>(timeline.size()) * makespan);
}

double pipeline_bubble_formula(PipelineScheduleKind kind, int stages, int micro_batches,
                               int virtual_stages, double forward_ms, double backward_ms,
                               double weight_ms) {
  check_arguments(kind, stages, micro_batches, virtual_stages);
  ZERO_CHECK(std::isfinite(forward_ms) && forward_ms > 0,
             "the forward time must be positive, got " << forward_ms);
  ZERO_CHECK(std::isfinite(backward_ms) && backward_ms > 0,
             "the backward time must be positive, got " << backward_ms);
  ZERO_CHECK(std::isfinite(weight_ms) && weight_ms >= 0,
             "the weight-gradient time must be at least 0, got " << weight_ms);
  const double p = stages;
  const double m = micro_batches;
  switch (kind) {
    case PipelineScheduleKind::kGpipe:
    case PipelineScheduleKind::kOneFOneB:
      return (p - 1) / (m + p - 1);
    case PipelineScheduleKind::kInterleaved:
      return (p - 1) / (virtual_stages * m + p - 1);
    case PipelineScheduleKind::kZeroBubbleH1: {
      const double idle = (p - 1) * (backward_ms + std::max(forward_ms - weight_ms, 0.0));
      return idle / (m * (forward_ms + backward_ms + weight_ms) + idle);
    }
  }
  return 0.0;
}

int pipeline_micro_batches_in_flight(PipelineScheduleKind kind, int stages, int stage,
                                     int micro_batches, int virtual_stages) {
  check_arguments(kind, stages, micro_batches, virtual_stages);
  ZERO_CHECK(stage >= 0 && stage < stages,
             "stage " << stage << " is outside the pipeline's 0.." << stages - 1);
  switch (kind) {
    case PipelineScheduleKind::kGpipe:
      return micro_batches;
    case PipelineScheduleKind::kOneFOneB:
    case PipelineScheduleKind::kZeroBubbleH1:
      return std::min(stages - stage, micro_batches);
    case PipelineScheduleKind::kInterleaved: {
      const int total = micro_batches * virtual_stages;
      if (micro_batches == stages) return total;
      return std::min(2 * (stages - stage - 1) + (virtual_stages - 1) * stages + 1, total);
    }
  }
  return 0;
}

std::vector<PipelineStageLoad> pipeline_stage_loads(PipelineScheduleKind kind, int stages,
                                                    int stage, int micro_batches,
                                                    int virtual_stages) {
  ZERO_CHECK(stage >= 0 && stage < stages,
             "stage " << stage << " is outside the pipeline's 0.." << stages - 1);
  const std::vector<std::vector<PipelineAction>> lists =
      make_pipeline_schedule(kind, stages, micro_batches, virtual_stages);
  std::vector<PipelineStageLoad> loads;
  PipelineStageLoad now;
  for (const PipelineAction& action : lists[static_cast<size_t>(stage)]) {
    switch (action.kind) {
      case PipelineAction::kForward:
        ++now.forwarded;
        break;
      case PipelineAction::kBackward:
        --now.forwarded;
        break;
      case PipelineAction::kBackwardInput: {
        --now.forwarded;
        ++now.awaiting_weight;
        PipelineStageLoad inside = now;
        inside.in_backward_input = true;
        loads.push_back(inside);
        break;
      }
      case PipelineAction::kBackwardWeight:
        --now.awaiting_weight;
        break;
      default:
        continue;  // a transfer
    }
    loads.push_back(now);
  }
  return loads;
}

}  // namespace zero
