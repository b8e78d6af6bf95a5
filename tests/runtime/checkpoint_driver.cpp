// A small training program for the checkpoint tests that need several jobs: loads across world
// sizes (saved at 4 ranks, resumed at 1-3) and crashes (a rank killed inside a save).
//
//   checkpoint_driver --dir D --stage S --steps N [--save-every K] [--resume]
//                     [--expect-start STEP] [--losses FILE] [--expect FILE --rel X]
//                     [--fault KIND@RANK --fault-step STEP]
//
// trains the example MLP up to step N (after --resume: from the step D's latest checkpoint
// holds), saving every K steps; rank 0 writes "step loss" lines to --losses, and with --expect
// compares each step's loss with the reference file's within relative X. --fault sets
// ZERO_TEST_CHECKPOINT_FAULT for the save at STEP. Exit 1 on any mismatch or error.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/runtime/checkpoint_util.h"
#include "zero/collectives/mpi_communicator.h"

namespace {

struct Options {
  std::string dir;
  int stage = 3;
  long steps = 0;
  long save_every = 0;
  bool resume = false;
  long expect_start = -1;
  std::string losses;
  std::string expect;
  double rel = 0.0;
  std::string fault;
  long fault_step = -1;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--resume") {
      o.resume = true;
      continue;
    }
    if (i + 1 >= argc) throw zero::Error("checkpoint_driver: " + flag + " needs a value");
    const std::string v = argv[++i];
    if (flag == "--dir") {
      o.dir = v;
    } else if (flag == "--stage") {
      o.stage = std::stoi(v);
    } else if (flag == "--steps") {
      o.steps = std::stol(v);
    } else if (flag == "--save-every") {
      o.save_every = std::stol(v);
    } else if (flag == "--expect-start") {
      o.expect_start = std::stol(v);
    } else if (flag == "--losses") {
      o.losses = v;
    } else if (flag == "--expect") {
      o.expect = v;
    } else if (flag == "--rel") {
      o.rel = std::stod(v);
    } else if (flag == "--fault") {
      o.fault = v;
    } else if (flag == "--fault-step") {
      o.fault_step = std::stol(v);
    } else {
      throw zero::Error("checkpoint_driver: unknown flag " + flag);
    }
  }
  if (o.dir.empty() || o.steps < 1) throw zero::Error("checkpoint_driver: needs --dir and --steps");
  return o;
}

// Steps whose loss differs from the reference by more than rel (relative), or that it lacks.
int compare(const std::map<long, float>& ran, const std::string& reference, double rel) {
  std::map<long, float> expected;
  std::ifstream in(reference);
  long step;
  float loss;
  while (in >> step >> loss) expected[step] = loss;
  int bad = 0;
  for (const auto& [s, value] : ran) {
    auto found = expected.find(s);
    if (found == expected.end()) {
      std::fprintf(stderr, "step %ld: not in %s\n", s, reference.c_str());
      ++bad;
      continue;
    }
    const double tolerance = rel * std::fabs(found->second);
    const bool ok = std::fabs(static_cast<double>(value) - found->second) <= tolerance;
    std::printf("step %ld: loss %.9g, reference %.9g%s\n", s, value, found->second,
                ok ? "" : "  MISMATCH");
    if (!ok) ++bad;
  }
  return bad;
}

int run(const Options& o) {
  std::unique_ptr<zero::Communicator> comm = zero::make_mpi_communicator();
  zero::testing::TrainSetup setup;
  setup.stage = o.stage;
  zero::testing::CheckpointTrainer trainer(*comm, setup);
  long first = 1;
  if (o.resume) {
    zero::TrainerState state;
    zero::load_checkpoint(trainer.engine(), o.dir, &state);
    if (comm->rank() == 0) std::printf("resumed from step %ld\n", state.step);
    if (o.expect_start >= 0 && state.step != o.expect_start) {
      std::fprintf(stderr, "resumed from step %ld, expected %ld\n", state.step, o.expect_start);
      return 1;
    }
    first = state.step + 1;
  }
  std::map<long, float> losses;
  for (long s = first; s <= o.steps; ++s) {
    losses[s] = trainer.step(s);
    if (o.save_every > 0 && s % o.save_every == 0) {
      if (s == o.fault_step) setenv("ZERO_TEST_CHECKPOINT_FAULT", o.fault.c_str(), 1);
      zero::save_checkpoint(trainer.engine(), o.dir, zero::TrainerState{s, setup.seed});
      unsetenv("ZERO_TEST_CHECKPOINT_FAULT");
    }
  }
  if (comm->rank() != 0) return 0;
  if (!o.losses.empty()) {
    std::FILE* out = std::fopen(o.losses.c_str(), "w");
    if (out == nullptr) throw zero::Error("cannot write " + o.losses);
    for (const auto& [s, value] : losses) std::fprintf(out, "%ld %.9g\n", s, value);
    if (std::fclose(out) != 0) throw zero::Error("cannot write " + o.losses);
  }
  return o.expect.empty() ? 0 : (compare(losses, o.expect, o.rel) == 0 ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  try {
    // Rank 0 compares; its exit code makes mpirun's non-zero on a mismatch.
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_driver: rank %d: %s\n", mpi.world_rank(), e.what());
    return 1;
  }
}
