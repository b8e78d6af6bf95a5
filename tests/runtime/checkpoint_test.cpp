// Checkpoints on 1-4 ranks: exact resume at every stage and dtype, loads across stages and
// dtypes, disk faults on any rank (a clear error everywhere, the previous checkpoint intact,
// training unchanged), corrupt and mismatched checkpoints refused before anything changes, and
// the safetensors export equal to the gathered model. Loads across world sizes run as separate
// jobs (tests/runtime/CMakeLists.txt, checkpoint_driver.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/runtime/checkpoint_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/config.h"

namespace zero::testing {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = make_mpi_communicator();
    dir_ = shared_temp_dir(*comm_);
  }
  void TearDown() override {
    unsetenv("ZERO_TEST_CHECKPOINT_FAULT");
    comm_->barrier_sync();
    if (comm_->rank() == 0) fs::remove_all(dir_);
  }

  // Losses of steps first..last, saving after each step listed in save_at.
  std::vector<float> run(CheckpointTrainer& t, long first, long last,
                         const std::vector<long>& save_at = {}, uint64_t seed = 7) {
    std::vector<float> losses;
    for (long s = first; s <= last; ++s) {
      losses.push_back(t.step(s));
      for (long at : save_at) {
        if (at == s) save_checkpoint(t.engine(), dir_, TrainerState{s, seed});
      }
    }
    return losses;
  }

  std::string latest() { return read_whole_file(dir_ + "/latest"); }

  std::unique_ptr<Communicator> comm_;
  std::string dir_;
};

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(float_bits(a[i]), float_bits(b[i]))
        << what << " at index " << i << ": " << a[i] << " vs " << b[i];
  }
}

// Saved at step 10 and resumed in a fresh engine, steps 11-20 give the same losses, bit for bit,
// as the run that went on without stopping.
TEST_F(CheckpointTest, ResumeIsBitwiseAtEveryStageAndDtype) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string what = std::string(dtype_name(dtype)) + " stage " + std::to_string(stage);
      TrainSetup setup;
      setup.stage = stage;
      setup.dtype = dtype;
      std::vector<float> straight;
      {
        CheckpointTrainer t(*comm_, setup);
        straight = run(t, 1, 20, {10});
      }
      // Another initialization: only the checkpoint can make the runs agree.
      TrainSetup other = setup;
      other.init_seed = 99;
      CheckpointTrainer resumed(*comm_, other);
      TrainerState trainer;
      load_checkpoint(resumed.engine(), dir_, &trainer);
      EXPECT_EQ(trainer.step, 10) << what;
      EXPECT_EQ(trainer.seed, 7u) << what;
      EXPECT_EQ(resumed.engine().optimizer_step(), 10) << what;
      const std::vector<float> tail = run(resumed, 11, 20);
      expect_bitwise(tail, std::vector<float>(straight.begin() + 10, straight.end()), what);
    }
  }
}

// Saved at stage 3, loaded at stages 0-2 on the same ranks: the same state, so the same losses.
TEST_F(CheckpointTest, LoadsAtAnotherStage) {
  TrainSetup setup;
  setup.stage = 3;
  std::vector<float> straight;
  {
    CheckpointTrainer t(*comm_, setup);
    straight = run(t, 1, 12, {6});
  }
  for (int stage = 0; stage <= 2; ++stage) {
    TrainSetup other = setup;
    other.stage = stage;
    CheckpointTrainer t(*comm_, other);
    load_checkpoint(t.engine(), dir_, nullptr);
    const std::vector<float> tail = run(t, 7, 12);
    for (size_t i = 0; i < tail.size(); ++i) {
      EXPECT_NEAR(tail[i], straight[6 + i], 1e-5 * std::fabs(straight[6 + i]))
          << "stage " << stage << " step " << 7 + i;
    }
  }
}

// The master is fp32 whatever the working dtype, so a bf16 checkpoint loads into an fp32 engine
// (and back) with the master bit for bit.
TEST_F(CheckpointTest, LoadsAcrossDtypes) {
  TrainSetup bf16;
  bf16.dtype = DType::kBFloat16;
  bf16.stage = 2;
  std::vector<std::vector<float>> saved;
  {
    CheckpointTrainer t(*comm_, bf16);
    run(t, 1, 3, {3});
    saved = t.engine().gather_full_master();
  }
  TrainSetup fp32;
  fp32.stage = 1;
  CheckpointTrainer t(*comm_, fp32);
  load_checkpoint(t.engine(), dir_, nullptr);
  EXPECT_EQ(t.engine().gather_full_master(), saved);
  EXPECT_EQ(t.engine().gather_full_params(), saved) << "fp32 working params are the master";
  save_checkpoint(t.engine(), dir_, TrainerState{4, 7});
  CheckpointTrainer back(*comm_, bf16);
  load_checkpoint(back.engine(), dir_, nullptr);
  EXPECT_EQ(back.engine().gather_full_master(), saved);
}

// A write error, an fsync error or a full disk on one rank, or a failed manifest on rank 0:
// every rank gets the error, the previous checkpoint and `latest` are untouched, no temporary
// directory is left, and training goes on exactly as if no save had been tried.
TEST_F(CheckpointTest, DiskFaultsFailEveryRankAndChangeNothing) {
  const int last = comm_->world_size() - 1;
  std::vector<float> reference;
  {
    CheckpointTrainer t(*comm_, TrainSetup{});
    reference = run(t, 1, 6);
  }
  const std::vector<std::pair<std::string, std::string>> faults = {
      {"write@" + std::to_string(last), "Input/output error"},
      {"nospace@" + std::to_string(last), "No space left on device"},
      {"fsync@" + std::to_string(last), "fsync"},
      {"manifest@0", "manifest.pbtxt"}};
  for (const auto& fault : faults) {
    CheckpointTrainer t(*comm_, TrainSetup{});
    std::vector<float> losses = run(t, 1, 4, {2});
    setenv("ZERO_TEST_CHECKPOINT_FAULT", fault.first.c_str(), 1);
    try {
      save_checkpoint(t.engine(), dir_, TrainerState{4, 7});
      ADD_FAILURE() << fault.first << ": the save did not fail";
    } catch (const Error& e) {
      const std::string message = e.what();
      const std::string rank = fault.first.substr(fault.first.find('@') + 1);
      EXPECT_NE(message.find("on rank " + rank), std::string::npos) << message;
      EXPECT_NE(message.find(fault.second), std::string::npos) << message;
    }
    unsetenv("ZERO_TEST_CHECKPOINT_FAULT");
    comm_->barrier_sync();
    EXPECT_EQ(latest(), "step_00000002\n") << fault.first;
    EXPECT_FALSE(fs::exists(dir_ + "/step_00000004")) << fault.first;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_EQ(entry.path().filename().string().rfind(".tmp_", 0), std::string::npos)
          << fault.first << " left " << entry.path();
    }
    const std::vector<float> rest = run(t, 5, 6);
    losses.insert(losses.end(), rest.begin(), rest.end());
    expect_bitwise(losses, reference, fault.first);

    CheckpointTrainer resumed(*comm_, TrainSetup{});
    TrainerState trainer;
    load_checkpoint(resumed.engine(), dir_, &trainer);
    EXPECT_EQ(trainer.step, 2) << fault.first;
    comm_->barrier_sync();
    if (comm_->rank() == 0) fs::remove_all(dir_ + "/step_00000002");
    comm_->barrier_sync();
  }
}

// A flipped byte in any shard file is refused on every rank, naming the file, and the engine
// keeps its state.
TEST_F(CheckpointTest, CorruptShardIsRefusedAndNothingChanges) {
  const int world = comm_->world_size();
  CheckpointTrainer t(*comm_, TrainSetup{});
  run(t, 1, 2, {2});
  run(t, 3, 3);
  const std::vector<std::vector<float>> before = t.engine().gather_full_master();
  const std::string bad = "rank_0000" + std::to_string(world - 1) + ".bin";
  if (comm_->rank() == 0) flip_byte(dir_ + "/step_00000002/" + bad, 5);
  comm_->barrier_sync();
  try {
    load_checkpoint(t.engine(), dir_, nullptr);
    ADD_FAILURE() << "a corrupt checkpoint was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.engine().gather_full_master(), before);
  EXPECT_EQ(t.engine().optimizer_step(), 3);
}

// Another model or another optimizer: a clear error naming the parameter and the manifest.
TEST_F(CheckpointTest, MismatchedModelOrOptimizerIsRefused) {
  {
    CheckpointTrainer t(*comm_, TrainSetup{});
    run(t, 1, 1, {1});
  }
  TrainSetup wider;
  wider.mlp.hidden_dim = 20;
  CheckpointTrainer w(*comm_, wider);
  try {
    load_checkpoint(w.engine(), dir_, nullptr);
    ADD_FAILURE() << "a model with other shapes loaded the checkpoint";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("has shape [20, 8] in the model but [24, 8]"), std::string::npos)
        << message;
    EXPECT_NE(message.find("step_00000001/manifest.pbtxt"), std::string::npos) << message;
  }
  TrainSetup sgd;
  sgd.optimizer = OptimizerType::kSgd;
  CheckpointTrainer s(*comm_, sgd);
  try {
    load_checkpoint(s.engine(), dir_, nullptr);
    ADD_FAILURE() << "an SGD engine loaded AdamW state";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("type AdamW in the checkpoint, SGD in this run"),
              std::string::npos)
        << e.what();
  }
  // Allowed on purpose, the state still has to fit the optimizer.
  try {
    load_checkpoint(s.engine(), dir_, nullptr, LoadOptions{true});
    ADD_FAILURE() << "an SGD engine loaded AdamW state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 2 optimizer state arrays"), std::string::npos)
        << e.what();
  }
}

// Other optimizer settings than the checkpoint's: a ConfigError on every rank naming each
// difference, the engine untouched; LoadOptions::override_optimizer allows it on purpose.
TEST_F(CheckpointTest, OtherOptimizerSettingsNeedAnOverride) {
  {
    CheckpointTrainer t(*comm_, TrainSetup{});
    run(t, 1, 1, {1});
  }
  TrainSetup other;
  other.optimizer = OptimizerType::kAdam;
  other.weight_decay = 0.0f;
  CheckpointTrainer t(*comm_, other);
  const std::vector<std::vector<float>> before = t.engine().gather_full_master();
  try {
    load_checkpoint(t.engine(), dir_, nullptr);
    ADD_FAILURE() << "an engine with other optimizer settings loaded the checkpoint";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "checkpoint " + dir_ +
                  "/step_00000001/manifest.pbtxt was saved with other optimizer settings: type "
                  "AdamW in the checkpoint, Adam (adam_w_mode false) in this run; weight_decay "
                  "0.01 in the checkpoint, 0 in this run. Resume with the checkpoint's, or allow "
                  "the change on purpose (zero-train --override-optimizer, or \"checkpoint\": "
                  "{\"override_optimizer\": true} in the config)");
  }
  EXPECT_EQ(t.engine().gather_full_master(), before);
  EXPECT_EQ(t.engine().optimizer_step(), 0);
  load_checkpoint(t.engine(), dir_, nullptr, LoadOptions{true});
  EXPECT_EQ(t.engine().optimizer_step(), 1);
  EXPECT_NE(t.engine().gather_full_master(), before);
}

// stage3_gather_16bit_weights_on_model_save: the step directory also holds the whole model in
// the working dtype, equal to the gathered parameters; without it, no such file.
TEST_F(CheckpointTest, ConsolidatedWeightsInTheWorkingDtype) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    TrainSetup setup;
    setup.dtype = dtype;
    CheckpointTrainer t(*comm_, setup);
    run(t, 1, 2, {1});
    save_checkpoint(t.engine(), dir_, TrainerState{2, 7}, SaveOptions{true});
    const std::vector<std::vector<float>> params = t.engine().gather_full_params();
    if (comm_->rank() == 0) {
      EXPECT_FALSE(fs::exists(dir_ + "/step_00000001/" + kConsolidatedWeightsName));
      const SafetensorsFile file =
          read_safetensors(dir_ + "/step_00000002/" + kConsolidatedWeightsName);
      const std::vector<ParamPlacement>& placed = t.engine().layout().params();
      ASSERT_EQ(file.tensors.size(), placed.size());
      for (size_t p = 0; p < placed.size(); ++p) {
        EXPECT_EQ(file.tensors[p].first, placed[p].name);
        EXPECT_EQ(file.tensors[p].second.dtype, dtype == DType::kBFloat16 ? "BF16" : "F16");
        EXPECT_EQ(file.tensors[p].second.shape, placed[p].shape);
        EXPECT_EQ(file.tensors[p].second.values, params[p]) << placed[p].name;
      }
    }
    comm_->barrier_sync();
    if (comm_->rank() == 0) fs::remove_all(dir_ + "/step_00000001");
    comm_->barrier_sync();
  }
}

// Saving a step again (after resuming from an earlier one) replaces it whole; leftovers of an
// interrupted save are removed by the next save.
TEST_F(CheckpointTest, ResavingAStepReplacesItAndLeftoversAreRemoved) {
  CheckpointTrainer t(*comm_, TrainSetup{});
  run(t, 1, 2, {2});
  if (comm_->rank() == 0) fs::create_directories(dir_ + "/.tmp_step_00000007/junk");
  comm_->barrier_sync();
  run(t, 3, 3);
  const std::vector<std::vector<float>> later = t.engine().gather_full_master();
  save_checkpoint(t.engine(), dir_, TrainerState{2, 7});
  EXPECT_FALSE(fs::exists(dir_ + "/.tmp_step_00000007"));
  EXPECT_EQ(latest(), "step_00000002\n");
  CheckpointTrainer other(*comm_, TrainSetup{});
  load_checkpoint(other.engine(), dir_ + "/step_00000002", nullptr);
  EXPECT_EQ(other.engine().gather_full_master(), later);
  EXPECT_EQ(other.engine().optimizer_step(), 3);
}

// The export (the code zero-checkpoint export runs) read back with the test's own reader equals
// the gathered master, in fp32 exactly and in bf16 rounded.
TEST_F(CheckpointTest, SafetensorsExportEqualsGatheredMaster) {
  TrainSetup setup;
  setup.dtype = DType::kBFloat16;
  CheckpointTrainer t(*comm_, setup);
  run(t, 1, 3, {3});
  const std::vector<std::vector<float>> master = t.engine().gather_full_master();
  if (comm_->rank() == 0) {
    const CheckpointInfo info = read_checkpoint_info(dir_);
    const std::vector<std::vector<float>> read = read_full_master({info});
    EXPECT_EQ(read, master);
    std::vector<NamedTensor> tensors;
    for (size_t p = 0; p < info.params.size(); ++p) {
      tensors.push_back({info.params[p].name, info.params[p].shape, &read[p]});
    }
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const std::string path = dir_ + "/model.safetensors";
      write_safetensors(path, tensors, dtype, {{"format", "pt"}});
      const SafetensorsFile file = read_safetensors(path);
      ASSERT_EQ(file.tensors.size(), master.size());
      const std::vector<ParamPlacement>& params = t.engine().layout().params();
      for (size_t p = 0; p < master.size(); ++p) {
        EXPECT_EQ(file.tensors[p].first, params[p].name);
        EXPECT_EQ(file.tensors[p].second.shape, params[p].shape);
        EXPECT_EQ(file.tensors[p].second.dtype, dtype == DType::kFloat32 ? "F32" : "BF16");
        std::vector<float> expected = master[p];
        if (dtype == DType::kBFloat16) {
          for (float& v : expected) v = bf16_to_float(float_to_bf16(v));
        }
        EXPECT_EQ(file.tensors[p].second.values, expected) << params[p].name;
      }
      ASSERT_EQ(file.metadata.size(), 1u);
      EXPECT_EQ(file.metadata[0].second, "pt");
    }
  }
}

}  // namespace
}  // namespace zero::testing
