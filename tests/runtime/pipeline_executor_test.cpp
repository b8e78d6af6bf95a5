// The pipeline executor on 1-4 ranks (one stage per rank): every schedule moves the right
// activations and gradients through a toy model whose values tell which stages touched them,
// the report counts the bytes, neighbours that disagree on the activation shape fail alike,
// ZB-H1 refuses work that does not split backward, and the timeline files are written.
#include "zero/runtime/pipeline_executor.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/expect_error.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"

namespace zero {
namespace {

using testing::expect_error_naming;

const std::vector<int64_t> kShape = {2, 3};

// Virtual stage k adds k + 1 to every element going forward and doubles the gradient going
// back. The first virtual stage starts micro-batch mb at mb; the last starts the gradient at the
// value it received plus one. What each computation saw is recorded for the checks.
class ToyWork : public PipelineStageWork {
 public:
  ToyWork(int stage, int stages, int virtual_stages, bool split)
      : stage_(stage), stages_(stages), last_(stages * virtual_stages - 1), split_(split) {}

  void forward(int mb, int chunk, const Tensor& input, Tensor& output) override {
    const int own = chunk * stages_ + stage_;
    const float in = own == 0 ? static_cast<float>(mb) : input.data()[0];
    EXPECT_EQ(input.numel(), own == 0 ? 0u : 6u);
    for (size_t i = 0; i < output.numel(); ++i) output.data()[i] = in + static_cast<float>(own + 1);
    forward_seen[{mb, chunk}] = in;
  }

  void backward(int mb, int chunk, const Tensor& grad_output, Tensor& grad_input) override {
    backward_input(mb, chunk, grad_output, grad_input);
    weights_done[{mb, chunk}] = true;
  }

  bool splits_backward() const override { return split_; }

  void backward_input(int mb, int chunk, const Tensor& grad_output, Tensor& grad_input) override {
    const int own = chunk * stages_ + stage_;
    EXPECT_TRUE(forward_seen.count({mb, chunk})) << "backward before forward";
    const float grad = own == last_ ? forward_seen[{mb, chunk}] + 1 : grad_output.data()[5];
    for (size_t i = 0; i < grad_input.numel(); ++i) grad_input.data()[i] = 2 * grad;
    backward_seen[{mb, chunk}] = grad;
  }

  void backward_weight(int mb, int chunk) override {
    EXPECT_TRUE(backward_seen.count({mb, chunk})) << "weight gradient before input gradient";
    weights_done[{mb, chunk}] = true;
  }

  std::map<std::pair<int, int>, float> forward_seen;   // the input's value
  std::map<std::pair<int, int>, float> backward_seen;  // the output gradient's value
  std::map<std::pair<int, int>, bool> weights_done;

 private:
  int stage_;
  int stages_;
  int last_;
  bool split_;
};

struct World {
  int rank = 0;
  int size = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
};

void check_values(PipelineScheduleKind kind, int m, int v) {
  const World world;
  const int p = world.size;
  SCOPED_TRACE(std::string(pipeline_schedule_name(kind)) + " p " + std::to_string(p) + " m " +
               std::to_string(m) + " v " + std::to_string(v));
  PeerChannel channel(MPI_COMM_WORLD);
  PipelineExecutor executor(channel, world.rank, p, make_pipeline_schedule(kind, p, m, v), kShape,
                            v);
  ToyWork work(world.rank, p, v, kind == PipelineScheduleKind::kZeroBubbleH1);
  for (int step = 0; step < 2; ++step) {  // the second step reuses the executor's buffers
    work = ToyWork(world.rank, p, v, kind == PipelineScheduleKind::kZeroBubbleH1);
    const PipelineStepReport report = executor.run(work);
    const int last = p * v - 1;
    // Going forward, virtual stage k received mb + (1 + 2 + ... + k).
    for (int mb = 0; mb < m; ++mb) {
      for (int chunk = 0; chunk < v; ++chunk) {
        const int own = chunk * p + world.rank;
        const float expected_in = static_cast<float>(mb + own * (own + 1) / 2);
        EXPECT_EQ(work.forward_seen.at({mb, chunk}), expected_in) << "mb " << mb;
        // Going back, the last stage's gradient (its input + 1) doubled once per stage after.
        const float top = static_cast<float>(mb + last * (last + 1) / 2 + 1);
        float expected_grad = top;
        for (int k = own; k < last; ++k) expected_grad *= 2;
        EXPECT_EQ(work.backward_seen.at({mb, chunk}), expected_grad) << "mb " << mb;
        EXPECT_TRUE(work.weights_done.at({mb, chunk}));
      }
    }
    // Each (micro-batch, chunk) not on the last virtual stage sends one activation, each not on
    // the first one gradient, of 6 floats.
    uint64_t messages = 0;
    for (int chunk = 0; chunk < v; ++chunk) {
      const int own = chunk * p + world.rank;
      messages += static_cast<uint64_t>(m) * ((own < last ? 1 : 0) + (own > 0 ? 1 : 0));
    }
    EXPECT_EQ(report.bytes_sent, messages * 24);
    EXPECT_EQ(report.bytes_received, messages * 24);
    EXPECT_EQ(report.timeline.size(), executor.schedules()[world.rank].size());
    EXPECT_GE(report.step_ms, report.busy_ms);
  }
}

TEST(PipelineExecutor, EveryScheduleCarriesActivationsAndGradients) {
  const int p = World().size;
  check_values(PipelineScheduleKind::kGpipe, 3, 1);
  check_values(PipelineScheduleKind::kOneFOneB, 2 * p + 1, 1);
  check_values(PipelineScheduleKind::kOneFOneB, 1, 1);
  check_values(PipelineScheduleKind::kZeroBubbleH1, 2 * p, 1);
  check_values(PipelineScheduleKind::kInterleaved, 2 * p, 2);
  check_values(PipelineScheduleKind::kInterleaved, p, 3);
}

TEST(PipelineExecutor, NeighboursThatDisagreeOnTheShapeFailAlike) {
  const World world;
  if (world.size < 2) GTEST_SKIP() << "needs 2 ranks";
  PeerChannel channel(MPI_COMM_WORLD);
  const std::vector<int64_t> shape =
      world.rank == world.size - 1 ? std::vector<int64_t>{2, 4} : kShape;
  expect_error_naming(
      [&] {
        PipelineExecutor(channel, world.rank, world.size,
                         make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, world.size, 2),
                         shape);
      },
      "pipeline stages " + std::to_string(world.size - 2) + " and " +
          std::to_string(world.size - 1) +
          " disagree on the activation shape between them: [2, 3] against [2, 4]");
}

TEST(PipelineExecutor, ZeroBubbleRefusesWorkThatDoesNotSplitBackward) {
  const World world;
  PeerChannel channel(MPI_COMM_WORLD);
  PipelineExecutor executor(
      channel, world.rank, world.size,
      make_pipeline_schedule(PipelineScheduleKind::kZeroBubbleH1, world.size, 2), kShape);
  ToyWork work(world.rank, world.size, 1, false);
  expect_error_naming([&] { executor.run(work); },
                      "splits backward into backward_input and backward_weight (zb-h1), and the "
                      "stage's work does not");
  EXPECT_TRUE(work.forward_seen.empty());
}

// Two stages, each a tensor-parallel group of 2, whose every rank holds the same tensors between
// the stages (as the GPT-2's do): the forward output and the input gradient of micro-batch mb are
// 100 mb + i (+ 1000 for the gradient) at element i, so a slice out of place shows.
class GroupWork : public PipelineStageWork {
 public:
  explicit GroupWork(int stage) : stage_(stage) {}
  void forward(int mb, int, const Tensor& input, Tensor& output) override {
    if (stage_ == 1) inputs[mb] = input.to_host();
    for (size_t i = 0; i < output.numel(); ++i) output.data()[i] = value(mb, i, 0);
  }
  void backward(int mb, int, const Tensor& grad_output, Tensor& grad_input) override {
    if (stage_ == 0) grad_outputs[mb] = grad_output.to_host();
    for (size_t i = 0; i < grad_input.numel(); ++i) grad_input.data()[i] = value(mb, i, 1000);
  }
  static float value(int mb, size_t i, int plus) {
    return static_cast<float>(plus + 100 * mb) + static_cast<float>(i);
  }
  std::map<int, std::vector<float>> inputs;        // stage 1: what each forward received
  std::map<int, std::vector<float>> grad_outputs;  // stage 0: what each backward received

 private:
  int stage_;
};

// pipe_partitioned and grad_partitioned: each rank of a tensor-parallel group sends its half,
// and the receiving group gathers the whole tensor; with either off, that kind goes whole.
TEST(PipelineExecutor, TensorParallelGroupsSendSlicesAndGatherTheWhole) {
  const World world;
  if (world.size != 4) GTEST_SKIP() << "needs 4 ranks: 2 stages of tensor-parallel groups of 2";
  const int stage = world.rank / 2;
  const int tp_rank = world.rank % 2;
  const std::unique_ptr<Communicator> group = make_mpi_communicator_split(stage, tp_rank);
  MPI_Comm pipeline = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, tp_rank, stage, &pipeline), MPI_SUCCESS);
  const int m = 3;
  const std::vector<int64_t> shape = {4, 6};  // 24 floats, 12 per slice
  for (const auto& [activations, gradients] : std::vector<std::pair<bool, bool>>{
           {true, true}, {true, false}, {false, true}, {false, false}}) {
    SCOPED_TRACE("pipe_partitioned " + std::to_string(activations) + ", grad_partitioned " +
                 std::to_string(gradients));
    PeerChannel channel(pipeline);
    PipelineExecutor executor(channel, stage, 2,
                              make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, 2, m), shape,
                              1, PipelineSlicing{group.get(), activations, gradients});
    GroupWork work(stage);
    const PipelineStepReport report = executor.run(work);
    for (int mb = 0; mb < m; ++mb) {
      const std::vector<float>& got = stage == 1 ? work.inputs.at(mb) : work.grad_outputs.at(mb);
      // EXPECT, not ASSERT: a rank that left the loop would leave the others in the executor.
      EXPECT_EQ(got.size(), 24u);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i], GroupWork::value(mb, i, stage == 1 ? 0 : 1000)) << "mb " << mb;
      }
    }
    // Stage 0 sends the activations and receives the gradients; stage 1 the other way round.
    const uint64_t activation_bytes = m * (activations ? 12 : 24) * sizeof(float);
    const uint64_t gradient_bytes = m * (gradients ? 12 : 24) * sizeof(float);
    EXPECT_EQ(report.bytes_sent, stage == 0 ? activation_bytes : gradient_bytes);
    EXPECT_EQ(report.bytes_received, stage == 0 ? gradient_bytes : activation_bytes);
  }
  EXPECT_EQ(MPI_Comm_free(&pipeline), MPI_SUCCESS);
  // A tensor the group cannot cut evenly is refused before anything is sent.
  PeerChannel channel(MPI_COMM_WORLD);
  expect_error_naming(
      [&] {
        PipelineExecutor(channel, world.rank, world.size,
                         make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, world.size, 2),
                         {3, 3}, 1, PipelineSlicing{group.get(), true, true});
      },
      "the activations between pipeline stages (9 floats) do not cut into 2 equal slices for the "
      "tensor-parallel group (pipe_partitioned)");
}

// Work that fails in the forward of micro-batch 1.
class FailingWork : public ToyWork {
 public:
  using ToyWork::ToyWork;
  void forward(int mb, int chunk, const Tensor& input, Tensor& output) override {
    ZERO_CHECK(mb != 1, "the work failed on micro-batch 1");
    ToyWork::forward(mb, chunk, input, output);
  }
};

TEST(PipelineExecutor, AnErrorInTheWorkUnwindsAndTheNextStepRuns) {
  const World world;
  const auto lists = make_pipeline_schedule(PipelineScheduleKind::kGpipe, world.size, 3);
  {
    // Stage 0 fails; the others then wait for micro-batch 1's activation until the timeout.
    // Each leaves run() with receives posted ahead, which are cancelled.
    PeerChannel channel(MPI_COMM_WORLD);
    channel.set_timeout(std::chrono::milliseconds(1000));
    PipelineExecutor executor(channel, world.rank, world.size, lists, kShape);
    FailingWork failing(world.rank, world.size, 1, false);
    expect_error_naming([&] { executor.run(failing); },
                        world.rank == 0
                            ? "the work failed on micro-batch 1"
                            : "rank " + std::to_string(world.rank) + ": receive from peer " +
                                  std::to_string(world.rank - 1) + ", tag ");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  PeerChannel channel(MPI_COMM_WORLD);
  PipelineExecutor executor(channel, world.rank, world.size, lists, kShape);
  ToyWork work(world.rank, world.size, 1, false);
  executor.run(work);
  EXPECT_EQ(work.forward_seen.size(), 3u);
  EXPECT_EQ(work.backward_seen.size(), 3u);
}

TEST(PipelineExecutor, BadPlacesAreRefused) {
  const World world;
  PeerChannel channel(MPI_COMM_WORLD);
  const auto lists = make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, world.size, 2);
  expect_error_naming([&] { PipelineExecutor(channel, world.rank, world.size + 1, lists, kShape); },
                      "stages but its peer channel " + std::to_string(world.size) + " ranks");
  expect_error_naming(
      [&] {
        PipelineExecutor(channel, (world.rank + 1) % (world.size + 1), world.size, lists, kShape);
      },
      "the stage is the channel's rank");
}

// PATH empty while it lives, as it was after.
class EmptyPath {
 public:
  EmptyPath() {
    const char* path = std::getenv("PATH");
    saved_ = path != nullptr ? path : "";
    EXPECT_EQ(::setenv("PATH", "", 1), 0);
  }
  ~EmptyPath() { EXPECT_EQ(::setenv("PATH", saved_.c_str(), 1), 0); }
  EmptyPath(const EmptyPath&) = delete;
  EmptyPath& operator=(const EmptyPath&) = delete;

 private:
  std::string saved_;
};

TEST(PipelineExecutor, TimelineFilesHoldMeasuredAndPlannedActions) {
  const World world;
  const int p = world.size;
  PeerChannel channel(MPI_COMM_WORLD);
  const auto lists = make_pipeline_schedule(PipelineScheduleKind::kZeroBubbleH1, p, 4);
  PipelineExecutor executor(channel, world.rank, p, lists, kShape);
  ToyWork work(world.rank, p, 1, true);
  const auto reports = gather_pipeline_reports(channel, executor.run(work));
  if (world.rank != 0) {
    EXPECT_TRUE(reports.empty());
    return;
  }
  ASSERT_EQ(reports.size(), static_cast<size_t>(p));
  for (int rank = 0; rank < p; ++rank) {
    EXPECT_EQ(reports[rank].timeline.size(), lists[rank].size()) << rank;
    for (size_t i = 0; i < lists[rank].size(); ++i) {
      EXPECT_EQ(reports[rank].timeline[i].action, lists[rank][i]);
    }
  }
  const std::string prefix =
      std::string(::testing::TempDir()) + "pipeline_timeline_np" + std::to_string(p);
  const std::string note = write_pipeline_timeline(prefix, reports, lists, {1.0, 1.0, 1.0});
  std::ifstream json_file(prefix + ".json");
  ASSERT_TRUE(json_file) << prefix << ".json";
  const nlohmann::json doc = nlohmann::json::parse(json_file);
  size_t measured = 0;
  size_t planned = 0;
  for (const auto& record : doc.at("actions")) {
    (record.at("timeline") == "measured" ? measured : planned) += 1;
    EXPECT_LE(record.at("start_ms").get<double>(), record.at("end_ms").get<double>());
  }
  size_t all = 0;
  for (const auto& list : lists) all += list.size();
  EXPECT_EQ(measured, all);
  EXPECT_EQ(planned, static_cast<size_t>(p) * 4 * 3);  // F, B and W of 4 micro-batches per rank
  if (note.empty()) {
    std::ifstream png(prefix + ".png", std::ios::binary);
    char magic[8] = {};
    png.read(magic, sizeof(magic));
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << prefix << ".png";
  } else {
    EXPECT_NE(note.find("wrote " + prefix + ".json without its picture"), std::string::npos);
  }
  // Without gnuplot on PATH: the JSON alone, and the note says so. PATH comes back however the
  // call ends.
  const std::string bare = prefix + "_without_gnuplot";
  std::remove((bare + ".png").c_str());
  std::string without;
  {
    const EmptyPath empty_path;
    without = write_pipeline_timeline(bare, reports, lists, {1.0, 1.0, 1.0});
  }
  EXPECT_NE(without.find("gnuplot is not on PATH"), std::string::npos) << without;
  EXPECT_NE(without.find("wrote " + bare + ".json without its picture"), std::string::npos)
      << without;
  EXPECT_TRUE(std::ifstream(bare + ".json").good());
  EXPECT_FALSE(std::ifstream(bare + ".png").good());
}

}  // namespace
}  // namespace zero
