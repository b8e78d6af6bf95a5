// PipelineExecutor (pipeline_executor.h): one rank's list of actions run against its
// PipelineStageWork, with the transfers on a PeerChannel; and the gathering of every rank's
// report on rank 0.
#include "zero/runtime/pipeline_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "zero/core/check.h"
#include "zero/core/text.h"

namespace zero {

namespace {

using Clock = std::chrono::steady_clock;
using Kind = PipelineAction::Kind;

// Tags of the executor's channel: 0 the shapes at construction, 1 the gathered reports, then one
// per message of a step.
constexpr int kShapeTag = 0;
constexpr int kReportTag = 1;
constexpr int kFirstMessageTag = 2;
// Longer shapes are refused; the exchange sends this many dimensions and the length.
constexpr size_t kMostDims = 16;
// Receives of each kind (activation, gradient) posted ahead of the action that names them.
constexpr int kReceivesAhead = 2;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool is_receive(Kind kind) {
  return kind == PipelineAction::kReceiveActivation || kind == PipelineAction::kReceiveGradient;
}

bool carries_gradient(Kind kind) {
  return kind == PipelineAction::kReceiveGradient || kind == PipelineAction::kSendGradient;
}

PipelineSlicing::Boundary boundary_of(Kind kind) {
  return carries_gradient(kind) ? PipelineSlicing::kGradient : PipelineSlicing::kActivation;
}

// (gradient, micro-batch, chunk): what a received or produced tensor is for on this rank.
using TensorKey = std::tuple<bool, int, int>;

}  // namespace

bool PipelineSlicing::slices(Boundary kind) const {
  const bool asked = kind == kGradient ? gradients : activations;
  return asked && tensor_parallel != nullptr && tensor_parallel->world_size() > 1;
}

ElementRange PipelineSlicing::range(Boundary kind, size_t numel) const {
  if (!slices(kind)) return {0, numel};
  const bool gradient = kind == kGradient;
  ZERO_CHECK(numel % static_cast<size_t>(tensor_parallel->world_size()) == 0,
             "the " << (gradient ? "gradients" : "activations") << " between pipeline stages ("
                    << numel << " floats) do not cut into " << tensor_parallel->world_size()
                    << " equal slices for the tensor-parallel group ("
                    << (gradient ? "grad_partitioned" : "pipe_partitioned") << ")");
  return shard_range(numel, tensor_parallel->rank(), tensor_parallel->world_size());
}

PeerRequest PipelineSlicing::send(PeerChannel& channel, int peer, int tag, const Tensor& whole,
                                  Boundary kind) const {
  const ElementRange part = range(kind, whole.numel());
  return channel.send(peer, tag, whole.data() + part.first, part.count * sizeof(float));
}

PeerRequest PipelineSlicing::receive(PeerChannel& channel, int peer, int tag, Tensor& whole,
                                     Boundary kind) const {
  const ElementRange part = range(kind, whole.numel());
  return channel.receive(peer, tag, whole.data() + part.first, part.count * sizeof(float));
}

void PipelineSlicing::gather(Boundary kind, Tensor& whole) const {
  if (!slices(kind)) return;
  const ElementRange mine = range(kind, whole.numel());
  // In place: this rank's slice is already where the whole tensor has it.
  tensor_parallel->all_gather(whole.data() + mine.first, whole.data(), mine.count, DType::kFloat32)
      .wait();
}

void PipelineStageWork::backward_input(int, int, const Tensor&, Tensor&) {
  ZERO_FAIL(
      "this PipelineStageWork does not split backward into backward_input and "
      "backward_weight (splits_backward() is false)");
}

void PipelineStageWork::backward_weight(int, int) {
  ZERO_FAIL(
      "this PipelineStageWork does not split backward into backward_input and "
      "backward_weight (splits_backward() is false)");
}

PipelineExecutor::PipelineExecutor(PeerChannel& channel, int stage, int stages,
                                   std::vector<std::vector<PipelineAction>> schedules,
                                   std::vector<int64_t> activation_shape, int virtual_stages,
                                   PipelineSlicing slicing)
    : channel_(channel),
      stage_(stage),
      stages_(stages),
      virtual_stages_(virtual_stages),
      schedules_(std::move(schedules)),
      activation_shape_(std::move(activation_shape)),
      slicing_(slicing) {
  ZERO_CHECK(stages >= 1, "a pipeline needs at least 1 stage, got " << stages);
  ZERO_CHECK(channel.size() == stages, "the pipeline has " << stages
                                                           << " stages but its peer channel "
                                                           << channel.size() << " ranks");
  ZERO_CHECK(stage == channel.rank(), "pipeline stage " << stage << " runs on channel rank "
                                                        << channel.rank()
                                                        << ": the stage is the channel's rank");
  for (const auto& list : schedules_) {
    for (const PipelineAction& a : list)
      micro_batches_ = std::max(micro_batches_, a.micro_batch + 1);
  }
  check_pipeline_schedule(schedules_, stages_, std::max(micro_batches_, 1), virtual_stages_);
  // The largest tag of a step: the last micro-batch's gradient to the last virtual stage.
  const int64_t virtual_count = static_cast<int64_t>(stages_) * virtual_stages_;
  const int64_t last_tag = kFirstMessageTag + micro_batches_ * virtual_count * 2 - 1;
  ZERO_CHECK(last_tag <= channel.max_tag(),
             "a pipeline step of " << micro_batches_ << " micro-batches over " << virtual_count
                                   << " virtual stages needs tags up to " << last_tag
                                   << ", more than the channel's " << channel.max_tag());
  exchange_shapes();
  // A shape the tensor-parallel group cannot slice is refused before anything is sent.
  size_t elements = 1;
  for (int64_t dim : activation_shape_) elements *= static_cast<size_t>(dim);
  slicing_.range(PipelineSlicing::kActivation, elements);
  slicing_.range(PipelineSlicing::kGradient, elements);
}

// Every rank sends its shape to every other, so that every rank checks every neighbouring pair
// and all fail alike (a rank that failed alone would leave its neighbours waiting).
void PipelineExecutor::exchange_shapes() {
  std::vector<int64_t> mine(kMostDims + 1, 0);
  mine[0] = static_cast<int64_t>(activation_shape_.size());
  for (size_t d = 0; d < std::min(activation_shape_.size(), kMostDims); ++d) {
    mine[d + 1] = activation_shape_[d];
  }
  const size_t bytes = mine.size() * sizeof(int64_t);
  std::vector<std::vector<int64_t>> all(static_cast<size_t>(stages_), mine);
  std::vector<PeerRequest> requests;
  for (int peer = 0; peer < stages_; ++peer) {
    if (peer == stage_) continue;
    requests.push_back(
        channel_.receive(peer, kShapeTag, all[static_cast<size_t>(peer)].data(), bytes));
    requests.push_back(channel_.send(peer, kShapeTag, mine.data(), bytes));
  }
  for (PeerRequest& request : requests) channel_.wait(request);
  std::vector<std::vector<int64_t>> shapes;
  for (int s = 0; s < stages_; ++s) {
    const std::vector<int64_t>& sent = all[static_cast<size_t>(s)];
    ZERO_CHECK(sent[0] >= 1 && static_cast<size_t>(sent[0]) <= kMostDims,
               "pipeline stage " << s << "'s activation shape has " << sent[0]
                                 << " dimensions; 1 to " << kMostDims << " are supported");
    shapes.emplace_back(sent.begin() + 1, sent.begin() + 1 + sent[0]);
    for (int64_t dim : shapes.back()) {
      ZERO_CHECK(dim >= 1, "pipeline stage " << s << "'s activation shape "
                                             << shape_text(shapes.back())
                                             << " has a dimension below 1");
    }
  }
  const int last = stages_ * virtual_stages_ - 1;
  for (int v = 0; v < last; ++v) {
    const int from = v % stages_;
    const int to = (v + 1) % stages_;
    const auto& a = shapes[static_cast<size_t>(from)];
    const auto& b = shapes[static_cast<size_t>(to)];
    ZERO_CHECK(a == b, "pipeline stages " << from << " and " << to
                                          << " disagree on the activation shape between them: "
                                          << shape_text(a) << " against " << shape_text(b));
  }
}

int PipelineExecutor::tag_of(const PipelineAction& transfer) const {
  // The message's receiving virtual stage, as both sides compute it.
  const int own = transfer.chunk * stages_ + stage_;
  int receiver = own;
  if (transfer.kind == PipelineAction::kSendActivation) receiver = own + 1;
  if (transfer.kind == PipelineAction::kSendGradient) receiver = own - 1;
  const int gradient = carries_gradient(transfer.kind) ? 1 : 0;
  return kFirstMessageTag + (transfer.micro_batch * stages_ * virtual_stages_ + receiver) * 2 +
         gradient;
}

PipelineStepReport PipelineExecutor::run(PipelineStageWork& work) {
  const std::vector<PipelineAction>& list = schedules_[static_cast<size_t>(stage_)];
  const bool splits = std::any_of(list.begin(), list.end(), [](const PipelineAction& a) {
    return a.kind == PipelineAction::kBackwardInput || a.kind == PipelineAction::kBackwardWeight;
  });
  ZERO_CHECK(!splits || work.splits_backward(),
             "this pipeline schedule splits backward into backward_input and backward_weight "
             "(zb-h1), and the stage's work does not (splits_backward() is false): use 1f1b, "
             "or work that splits");
  const int last = stages_ * virtual_stages_ - 1;
  const auto take_buffer = [&] {
    if (free_buffers_.empty()) return Tensor(activation_shape_);
    Tensor t = std::move(free_buffers_.back());
    free_buffers_.pop_back();
    return t;
  };
  const auto check_shape = [&](const Tensor& t, const PipelineAction& a, const char* what) {
    ZERO_CHECK(t.shape() == activation_shape_,
               "pipeline stage " << stage_ << ": " << pipeline_action_name(a.kind)
                                 << " of micro-batch " << a.micro_batch << ", chunk " << a.chunk
                                 << " left its " << what << " shaped " << shape_text(t.shape())
                                 << ", not the agreed " << shape_text(activation_shape_));
  };

  // A transfer and its buffer. The buffer is declared first so that it outlives the request:
  // an error unwinding past a pending receive cancels it before its buffer goes.
  struct Posted {
    Tensor buffer;
    PeerRequest request;
  };
  std::map<size_t, Posted> posted;       // receives posted, by their action's index
  std::map<TensorKey, Tensor> received;  // received, not yet consumed
  std::map<TensorKey, Tensor> produced;  // computed, not yet sent
  std::vector<Posted> sending;           // sends posted, not yet seen done
  size_t next_receive[2] = {0, 0};       // per kind (activation, gradient): the next to post
  int ahead[2] = {0, 0};                 // posted and not yet waited for

  // Posts the receives of kind `gradient` in list order: through index `until` whatever the
  // budget (-1: none), then while fewer than kReceivesAhead are outstanding.
  const auto post_receives = [&](int gradient, long until) {
    size_t& i = next_receive[gradient];
    for (; i < list.size(); ++i) {
      const PipelineAction& a = list[i];
      if (!is_receive(a.kind) || carries_gradient(a.kind) != (gradient == 1)) continue;
      if (static_cast<long>(i) > until && ahead[gradient] >= kReceivesAhead) break;
      Posted p{take_buffer(), PeerRequest()};
      p.request = slicing_.receive(channel_, pipeline_peer(a, stage_, stages_), tag_of(a), p.buffer,
                                   boundary_of(a.kind));
      posted.emplace(i, std::move(p));
      ++ahead[gradient];
    }
  };
  // Sends that are done give their buffers back, without waiting.
  const auto reap_sends = [&] {
    for (auto it = sending.begin(); it != sending.end();) {
      if (channel_.test(it->request)) {
        free_buffers_.push_back(std::move(it->buffer));
        it = sending.erase(it);
      } else {
        ++it;
      }
    }
  };

  PipelineStepReport report;
  const PeerChannelCounters before = channel_.counters();
  const Clock::time_point start = Clock::now();
  const Tensor none;
  for (size_t i = 0; i < list.size(); ++i) {
    const PipelineAction& a = list[i];
    post_receives(0, -1);
    post_receives(1, -1);
    reap_sends();
    const double began = ms_since(start);
    const int own = a.chunk * stages_ + stage_;
    switch (a.kind) {
      case PipelineAction::kReceiveActivation:
      case PipelineAction::kReceiveGradient: {
        const int gradient = carries_gradient(a.kind) ? 1 : 0;
        post_receives(gradient, static_cast<long>(i));
        Posted& p = posted.at(i);
        channel_.wait(p.request);
        --ahead[gradient];
        slicing_.gather(boundary_of(a.kind), p.buffer);
        received[TensorKey{gradient == 1, a.micro_batch, a.chunk}] = std::move(p.buffer);
        posted.erase(i);
        break;
      }
      case PipelineAction::kSendActivation:
      case PipelineAction::kSendGradient: {
        auto found = produced.find(TensorKey{carries_gradient(a.kind), a.micro_batch, a.chunk});
        ZERO_CHECK(found != produced.end(), "pipeline stage " << stage_ << ": "
                                                              << pipeline_action_name(a.kind)
                                                              << " of micro-batch " << a.micro_batch
                                                              << " before it was computed");
        Posted p{std::move(found->second), PeerRequest()};
        produced.erase(found);
        p.request = slicing_.send(channel_, pipeline_peer(a, stage_, stages_), tag_of(a), p.buffer,
                                  boundary_of(a.kind));
        sending.push_back(std::move(p));
        break;
      }
      case PipelineAction::kForward: {
        Tensor input;
        if (own > 0) {
          auto found = received.find(TensorKey{false, a.micro_batch, a.chunk});
          input = std::move(found->second);
          received.erase(found);
        }
        Tensor output = take_buffer();
        work.forward(a.micro_batch, a.chunk, own > 0 ? input : none, output);
        if (own < last) {
          check_shape(output, a, "output");
          produced[TensorKey{false, a.micro_batch, a.chunk}] = std::move(output);
        } else {
          free_buffers_.push_back(std::move(output));
        }
        if (own > 0) free_buffers_.push_back(std::move(input));
        break;
      }
      case PipelineAction::kBackward:
      case PipelineAction::kBackwardInput: {
        Tensor grad_output;
        if (own < last) {
          auto found = received.find(TensorKey{true, a.micro_batch, a.chunk});
          grad_output = std::move(found->second);
          received.erase(found);
        }
        Tensor grad_input = take_buffer();
        const Tensor& given = own < last ? grad_output : none;
        if (a.kind == PipelineAction::kBackward) {
          work.backward(a.micro_batch, a.chunk, given, grad_input);
        } else {
          work.backward_input(a.micro_batch, a.chunk, given, grad_input);
        }
        if (own > 0) {
          check_shape(grad_input, a, "input gradient");
          produced[TensorKey{true, a.micro_batch, a.chunk}] = std::move(grad_input);
        } else {
          free_buffers_.push_back(std::move(grad_input));
        }
        if (own < last) free_buffers_.push_back(std::move(grad_output));
        break;
      }
      case PipelineAction::kBackwardWeight:
        work.backward_weight(a.micro_batch, a.chunk);
        break;
    }
    const double ended = ms_since(start);
    report.timeline.push_back({a, began, ended});
    if (is_pipeline_compute(a.kind)) report.busy_ms += ended - began;
  }
  for (Posted& p : sending) {
    channel_.wait(p.request);
    free_buffers_.push_back(std::move(p.buffer));
  }
  report.step_ms = ms_since(start);
  const PeerChannelCounters& after = channel_.counters();
  report.wait_ms = after.wait_ms - before.wait_ms;
  report.bytes_sent = after.bytes_sent - before.bytes_sent;
  report.bytes_received = after.bytes_received - before.bytes_received;
  return report;
}

std::vector<PipelineStepReport> gather_pipeline_reports(PeerChannel& channel,
                                                        const PipelineStepReport& mine) {
  // A report as doubles: step, busy, wait, bytes sent, bytes received, then five per action.
  constexpr size_t kHead = 5;
  constexpr size_t kPerAction = 5;
  const auto encode = [&](const PipelineStepReport& r) {
    std::vector<double> out = {r.step_ms, r.busy_ms, r.wait_ms, static_cast<double>(r.bytes_sent),
                               static_cast<double>(r.bytes_received)};
    for (const PipelineActionTiming& t : r.timeline) {
      out.insert(out.end(),
                 {static_cast<double>(t.action.kind), static_cast<double>(t.action.micro_batch),
                  static_cast<double>(t.action.chunk), t.start_ms, t.end_ms});
    }
    return out;
  };
  const auto decode = [&](const std::vector<double>& in) {
    PipelineStepReport r;
    r.step_ms = in[0];
    r.busy_ms = in[1];
    r.wait_ms = in[2];
    r.bytes_sent = static_cast<uint64_t>(in[3]);
    r.bytes_received = static_cast<uint64_t>(in[4]);
    for (size_t i = kHead; i + kPerAction <= in.size(); i += kPerAction) {
      r.timeline.push_back({{static_cast<Kind>(static_cast<int>(in[i])),
                             static_cast<int>(in[i + 1]), static_cast<int>(in[i + 2])},
                            in[i + 3],
                            in[i + 4]});
    }
    return r;
  };
  const std::vector<double> payload = encode(mine);
  if (channel.rank() != 0) {
    uint64_t length = payload.size();
    PeerRequest a = channel.send(0, kReportTag, &length, sizeof(length));
    channel.wait(a);
    PeerRequest b = channel.send(0, kReportTag, payload.data(), payload.size() * sizeof(double));
    channel.wait(b);
    return {};
  }
  std::vector<PipelineStepReport> all = {mine};
  for (int peer = 1; peer < channel.size(); ++peer) {
    uint64_t length = 0;
    PeerRequest a = channel.receive(peer, kReportTag, &length, sizeof(length));
    channel.wait(a);
    ZERO_CHECK(length >= kHead && (length - kHead) % kPerAction == 0,
               "pipeline stage " << peer << " sent a report of " << length << " numbers");
    std::vector<double> in(length);
    PeerRequest b = channel.receive(peer, kReportTag, in.data(), length * sizeof(double));
    channel.wait(b);
    all.push_back(decode(in));
  }
  return all;
}

}  // namespace zero
