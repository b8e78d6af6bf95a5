// The pipeline schedules as data: golden orders for small pipelines, every list of every kind
// checked runnable over 1-8 stages and 1-16 micro-batches, the activations in flight and the
// simulated bubble against the formulas, and the errors of bad arguments and broken lists.
#include "zero/runtime/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/expect_error.h"

namespace zero {
namespace {

using testing::expect_error_naming;
using Lists = std::vector<std::vector<PipelineAction>>;

// The compute actions of one list as labels ("F0 F1 B0 ..."), or every action with `all`.
std::string labels(const std::vector<PipelineAction>& list, bool all = false) {
  std::string text;
  for (const PipelineAction& a : list) {
    if (!all && !is_pipeline_compute(a.kind)) continue;
    text += (text.empty() ? "" : " ") + pipeline_action_label(a);
  }
  return text;
}

std::vector<std::string> compute_orders(PipelineScheduleKind kind, int p, int m, int v = 1) {
  std::vector<std::string> orders;
  for (const auto& list : make_pipeline_schedule(kind, p, m, v)) orders.push_back(labels(list));
  return orders;
}

// The most (micro-batch, chunk) pairs whose forward has run and input gradient has not.
int in_flight(const std::vector<PipelineAction>& list) {
  int now = 0;
  int most = 0;
  for (const PipelineAction& a : list) {
    if (a.kind == PipelineAction::kForward) most = std::max(most, ++now);
    if (a.kind == PipelineAction::kBackward || a.kind == PipelineAction::kBackwardInput) --now;
  }
  return most;
}

const PipelineScheduleKind kKinds[] = {
    PipelineScheduleKind::kGpipe, PipelineScheduleKind::kOneFOneB,
    PipelineScheduleKind::kInterleaved, PipelineScheduleKind::kZeroBubbleH1};

// The (v, valid) pairs each kind is tried with at p stages and m micro-batches.
std::vector<int> chunk_counts(PipelineScheduleKind kind, int p, int m) {
  if (kind != PipelineScheduleKind::kInterleaved) return {1};
  if (m % p != 0) return {};
  return {2, 3};
}

TEST(PipelineSchedule, NamesRoundTrip) {
  for (PipelineScheduleKind kind : kKinds) {
    EXPECT_EQ(parse_pipeline_schedule(pipeline_schedule_name(kind)), kind);
  }
  expect_error_naming([] { parse_pipeline_schedule("1F1B"); },
                      "unknown pipeline schedule '1F1B': expected gpipe, 1f1b, interleaved or "
                      "zb-h1");
}

TEST(PipelineSchedule, GpipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(compute_orders(PipelineScheduleKind::kGpipe, 2, 4),
            (std::vector<std::string>{"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3"}));
  for (const std::string& order : compute_orders(PipelineScheduleKind::kGpipe, 3, 6)) {
    EXPECT_EQ(order, "F0 F1 F2 F3 F4 F5 B0 B1 B2 B3 B4 B5");
  }
}

TEST(PipelineSchedule, OneFOneBWarmsUpWithStagesMinusStageMinusOneForwards) {
  EXPECT_EQ(compute_orders(PipelineScheduleKind::kOneFOneB, 4, 8),
            (std::vector<std::string>{
                "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
                "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
                "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
                "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
            }));
  EXPECT_EQ(compute_orders(PipelineScheduleKind::kOneFOneB, 3, 5),
            (std::vector<std::string>{
                "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4",
                "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4",
                "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4",
            }));
}

TEST(PipelineSchedule, TransfersSurroundTheComputeThatUsesThem) {
  const Lists lists = make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, 2, 2);
  EXPECT_EQ(labels(lists[0], true), "F0 sA0 F1 sA1 rG0 B0 rG1 B1");
  EXPECT_EQ(labels(lists[1], true), "rA0 F0 B0 sG0 rA1 F1 B1 sG1");
  const Lists three = make_pipeline_schedule(PipelineScheduleKind::kZeroBubbleH1, 3, 4);
  EXPECT_EQ(labels(three[1], true),
            "rA0 F0 sA0 rA1 F1 sA1 rG0 I0 sG0 rA2 F2 sA2 rG1 I1 sG1 W0 rA3 F3 sA3 rG2 I2 sG2 W1 "
            "rG3 I3 sG3 W2 W3");
}

TEST(PipelineSchedule, ZeroBubbleH1DefersStageWeightGradients) {
  EXPECT_EQ(compute_orders(PipelineScheduleKind::kZeroBubbleH1, 4, 8),
            (std::vector<std::string>{
                "F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7",
                "F0 F1 F2 I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7",
                "F0 F1 I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7",
                "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7",
            }));
  EXPECT_EQ(compute_orders(PipelineScheduleKind::kZeroBubbleH1, 2, 4),
            (std::vector<std::string>{"F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3",
                                      "F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3"}));
}

TEST(PipelineSchedule, InterleavedFollowsMegatron) {
  EXPECT_EQ(compute_orders(PipelineScheduleKind::kInterleaved, 2, 4, 2),
            (std::vector<std::string>{
                "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3",
                "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3",
            }));
  const auto four = compute_orders(PipelineScheduleKind::kInterleaved, 4, 8, 2);
  EXPECT_EQ(four[0],
            "F0 F1 F2 F3 F0.1 F1.1 F2.1 F3.1 F4 F5 F6 B0.1 F7 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0 "
            "F7.1 B1 B2 B3 B4.1 B5.1 B6.1 B7.1 B4 B5 B6 B7");
  EXPECT_EQ(four[3],
            "F0 F1 F2 F3 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4 B0 F5 B1 F6 B2 F7 B3 F4.1 "
            "B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4 B5 B6 B7");
  // m = p: every forward first, as Megatron does.
  EXPECT_EQ(compute_orders(PipelineScheduleKind::kInterleaved, 2, 2, 2)[1],
            "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1");
  // Across the last stage to stage 0 of the next chunk.
  const Lists lists = make_pipeline_schedule(PipelineScheduleKind::kInterleaved, 2, 2, 2);
  EXPECT_EQ(labels(lists[0], true),
            "F0 sA0 F1 sA1 rA0.1 F0.1 sA0.1 rA1.1 F1.1 sA1.1 rG0.1 B0.1 sG0.1 rG1.1 B1.1 sG1.1 "
            "rG0 B0 rG1 B1");
  EXPECT_EQ(pipeline_peer(lists[0][4], 0, 2), 1);  // rA0.1 comes from stage 1's chunk 0
}

TEST(PipelineSchedule, EveryListOfEveryKindIsRunnable) {
  for (PipelineScheduleKind kind : kKinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        for (int v : chunk_counts(kind, p, m)) {
          SCOPED_TRACE(std::string(pipeline_schedule_name(kind)) + " p " + std::to_string(p) +
                       " m " + std::to_string(m) + " v " + std::to_string(v));
          const Lists lists = make_pipeline_schedule(kind, p, m, v);
          EXPECT_NO_THROW(check_pipeline_schedule(lists, p, m, v));
          for (int s = 0; s < p; ++s) {
            EXPECT_EQ(in_flight(lists[static_cast<size_t>(s)]),
                      pipeline_micro_batches_in_flight(kind, p, s, m, v))
                << "stage " << s;
            // The loads: the forwarded peak is the in-flight figure, and only a split backward
            // leaves micro-batches awaiting their weight gradients, at most s of them (ZB-H1
            // defers each until s are pending) and none at the step's end.
            const std::vector<PipelineStageLoad> loads = pipeline_stage_loads(kind, p, s, m, v);
            int most_forwarded = 0, most_awaiting = 0;
            for (const PipelineStageLoad& load : loads) {
              most_forwarded = std::max(most_forwarded, load.forwarded);
              most_awaiting = std::max(most_awaiting, load.awaiting_weight);
            }
            EXPECT_EQ(most_forwarded, pipeline_micro_batches_in_flight(kind, p, s, m, v));
            const bool split = kind == PipelineScheduleKind::kZeroBubbleH1;
            EXPECT_EQ(most_awaiting, split ? std::min(s + 1, m) : 0) << "stage " << s;
            EXPECT_EQ(loads.back().forwarded, 0);
            EXPECT_EQ(loads.back().awaiting_weight, 0);
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, SimulatedBubbleMatchesTheFormula) {
  const PipelineDurations equal{1.0, 1.0, 1.0};
  const PipelineDurations uneven{2.0, 3.0, 1.0};  // W <= F: the zero-bubble paper's case
  // W > F: ZB-H1's weight gradients no longer fit the warm-up's gaps, (p-1)B idle.
  const PipelineDurations heavy_weights{1.0, 2.0, 3.0};
  for (PipelineScheduleKind kind : kKinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 16; ++m) {
        for (int v : chunk_counts(kind, p, m)) {
          for (const PipelineDurations& d : {equal, uneven, heavy_weights}) {
            SCOPED_TRACE(std::string(pipeline_schedule_name(kind)) + " p " + std::to_string(p) +
                         " m " + std::to_string(m) + " v " + std::to_string(v) + " F " +
                         std::to_string(d.forward));
            const Lists lists = make_pipeline_schedule(kind, p, m, v);
            const PipelineDurations chunk{d.forward / v, d.backward / v, d.weight / v};
            const double simulated =
                simulated_bubble_fraction(simulate_pipeline_schedule(lists, p, chunk));
            EXPECT_NEAR(simulated,
                        pipeline_bubble_formula(kind, p, m, v, d.forward, d.backward, d.weight),
                        1e-9);
          }
        }
      }
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleH1IdlesAThirdOfOneFOneB) {
  // p 4, m 8, F = B = W: 1F1B idles (p-1)(F+B+W) per rank, ZB-H1 (p-1)F.
  const double one_f_one_b =
      pipeline_bubble_formula(PipelineScheduleKind::kOneFOneB, 4, 8, 1, 10, 10, 10);
  const double zero_bubble =
      pipeline_bubble_formula(PipelineScheduleKind::kZeroBubbleH1, 4, 8, 1, 10, 10, 10);
  EXPECT_DOUBLE_EQ(one_f_one_b, 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(zero_bubble, 30.0 / 270.0);
  // As idle time: a step of work W = m(F+B+W) plus idle I has I = f W / (1 - f).
  const auto idle = [](double f) { return f / (1 - f); };
  EXPECT_NEAR(idle(zero_bubble) / idle(one_f_one_b), 1.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(PipelineScheduleKind::kInterleaved, 4, 8, 2, 1, 1, 1),
                   3.0 / 19.0);
}

TEST(PipelineSchedule, BadArgumentsNameTheValue) {
  const auto kind = PipelineScheduleKind::kOneFOneB;
  expect_error_naming([&] { make_pipeline_schedule(kind, 0, 4); }, "at least 1 stage, got 0");
  expect_error_naming([&] { make_pipeline_schedule(kind, 2, 0); }, "at least 1 micro-batch, got 0");
  expect_error_naming([&] { make_pipeline_schedule(kind, 2, 4, 0); }, "at least 1, got 0");
  expect_error_naming(
      [&] { make_pipeline_schedule(kind, 2, 4, 2); },
      "1f1b schedule has one model chunk per rank: virtual stages must be 1, got 2");
  expect_error_naming([&] { make_pipeline_schedule(PipelineScheduleKind::kInterleaved, 2, 4, 1); },
                      "at least 2 virtual stages (model chunks) per rank, got 1");
  expect_error_naming([&] { make_pipeline_schedule(PipelineScheduleKind::kInterleaved, 4, 6, 2); },
                      "multiple of the stages (as Megatron's), got 6 micro-batches for 4 stages");
  expect_error_naming([&] { pipeline_bubble_formula(kind, 2, 4, 1, 0, 1, 1); },
                      "forward time must be positive, got 0");
  expect_error_naming([&] { pipeline_micro_batches_in_flight(kind, 2, 2, 4); },
                      "stage 2 is outside the pipeline's 0..1");
  expect_error_naming([&] { check_pipeline_schedule(Lists(3), 2, 4); },
                      "2 stages needs 2 action lists, got 3");
}

TEST(PipelineSchedule, BrokenListsAreRefused) {
  const Lists good = make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, 2, 2);
  Lists missing = good;
  missing[1].erase(missing[1].begin());  // rA0
  expect_error_naming([&] { check_pipeline_schedule(missing, 2, 2); },
                      "rank 1 action 0 (forward of micro-batch 0, chunk 0): runs before its "
                      "activation is received");
  Lists twice = good;
  twice[0].push_back(twice[0][0]);
  expect_error_naming([&] { check_pipeline_schedule(twice, 2, 2); }, "runs twice");
  Lists outside = good;
  outside[0][0].micro_batch = 2;
  expect_error_naming([&] { check_pipeline_schedule(outside, 2, 2); },
                      "the micro-batch is outside 0..1");
  Lists no_weight = make_pipeline_schedule(PipelineScheduleKind::kZeroBubbleH1, 2, 2);
  no_weight[0].pop_back();  // W1
  expect_error_naming([&] { check_pipeline_schedule(no_weight, 2, 2); },
                      "rank 0, micro-batch 1, chunk 0: backward_input without its "
                      "backward_weight");
  // Each list is complete, but rank 1 takes micro-batch 1 first: it waits for an activation
  // that rank 0 sends only after micro-batch 0's gradient, which rank 1 sends after that.
  Lists crossed = good;
  crossed[0] = {{PipelineAction::kForward, 0, 0},         {PipelineAction::kSendActivation, 0, 0},
                {PipelineAction::kReceiveGradient, 0, 0}, {PipelineAction::kBackward, 0, 0},
                {PipelineAction::kForward, 1, 0},         {PipelineAction::kSendActivation, 1, 0},
                {PipelineAction::kReceiveGradient, 1, 0}, {PipelineAction::kBackward, 1, 0}};
  crossed[1] = {{PipelineAction::kReceiveActivation, 1, 0}, {PipelineAction::kForward, 1, 0},
                {PipelineAction::kBackward, 1, 0},          {PipelineAction::kSendGradient, 1, 0},
                {PipelineAction::kReceiveActivation, 0, 0}, {PipelineAction::kForward, 0, 0},
                {PipelineAction::kBackward, 0, 0},          {PipelineAction::kSendGradient, 0, 0}};
  expect_error_naming([&] { check_pipeline_schedule(crossed, 2, 2); },
                      "the pipeline schedule deadlocks: rank 0 action 2 (receive_gradient of "
                      "micro-batch 0, chunk 0) waits for stage 1; rank 1 action 0 "
                      "(receive_activation of micro-batch 1, chunk 0) waits for stage 0");
}

}  // namespace
}  // namespace zero
