#include "examples/train_flags.h"

#include <signal.h>

#include <limits>

#include <string>
#include <utility>

#include "driver/cli.h"
#include "zero/core/check.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero::examples {

using driver::parse_at_least;
using driver::parse_between;
using driver::parse_bytes;
using driver::parse_float_at_least;
using driver::usage_error;

const char* const kTrainUsage =
    "usage: zero-train [--config FILE] [--model mlp|gpt2] [--steps N] [--stage 0|1|2|3]\n"
    "                  [--tp T (gpt2: tensor-parallel size)]\n"
    "                  [--pp P (gpt2: pipeline stages)\n"
    "                   [--pp-schedule gpipe|1f1b|interleaved|zb-h1]\n"
    "                   [--pp-virtual-stages V (interleaved: model chunks per stage, 2)]\n"
    "                   [--pp-partition parameters|uniform|flops|type:REGEX]\n"
    "                   [--pp-schedule-dump FILE]\n"
    "                   [--pp-regather]]\n"
    "                  [--dtype fp32|bf16|fp16] [--seed S] [--global-batch B]\n"
    "                  [--micro-batches K] [--lr X] [--weight-decay X] [--clip X]\n"
    "                  [--schedule constant|warmup|linear|cosine] [--warmup N]\n"
    "                  [--steps-per-print N] [--metrics FILE] [--trace FILE]\n"
    "                  [--memory-summary-every K] [--memory-timeline FILE]\n"
    "                  mlp:  [--input-dim N] [--hidden N] [--output-dim N] [--layers N]\n"
    "                  gpt2: --data FILES [--val-data FILES] [--val-every K] [--val-batches M]\n"
    "                        [--preset tiny|gpt2-124M|gpt2-350M|gpt2-774M|gpt2-1.5B]\n"
    "                        [--n-layer N] [--n-head N] [--n-embd N] [--vocab-size N]\n"
    "                        [--block-size N] [--seq-len N] [--decay-all] [--init-from FILE]\n"
    "                        [--activation-checkpointing none|selective|full]\n"
    "                        [--number-checkpoints N] [--partition-activations]\n"
    "                        [--checkpoint-nvme-path DIR]\n"
    "                  [--merge-bytes N] [--threads N] [--memory-limit BYTES[K|M|G]]\n"
    "                  [--save-dir DIR] [--save-every K] [--resume DIR|latest]\n"
    "                  [--override-optimizer]\n"
    "                  [--nonfinite error|skip] [--inject-fault "
    "inf-grad|kill|stop|skip-step@STEP]\n"
    "                  [--device cpu|cuda] [--test-comm-delay-us N]\n";

namespace {

Fault parse_fault(const std::string& v) {
  const size_t at = v.find('@');
  const std::string kind = v.substr(0, at);
  Fault fault;
  if (kind == "inf-grad") fault.kind = Fault::kInfGrad;
  if (kind == "kill") fault.kind = Fault::kKill;
  if (kind == "stop") fault.kind = Fault::kStop;
  if (kind == "skip-step") fault.kind = Fault::kSkipStep;
  if (fault.kind == Fault::kNone || at == std::string::npos) {
    usage_error("--inject-fault expects inf-grad|kill|stop|skip-step@STEP, got '" + v + "'");
  }
  fault.step = parse_at_least("--inject-fault", v.substr(at + 1), 1);
  return fault;
}

}  // namespace

void inject_fault(const Fault& fault, zero::Tensor& grad) {
  if (fault.kind == Fault::kInfGrad) {
    std::vector<float> values = grad.to_host();
    values[0] = std::numeric_limits<float>::infinity();
    grad = zero::Tensor(grad.shape(), values, grad.device());
  }
  if (fault.kind == Fault::kKill) raise(SIGKILL);
  if (fault.kind == Fault::kStop) raise(SIGSTOP);
}

namespace {

// The MLP's size flags; false for another flag.
bool parse_mlp_flag(const std::string& flag, const std::string& v, Flags* f) {
  int* field = flag == "--input-dim"    ? &f->mlp.input_dim
               : flag == "--hidden"     ? &f->mlp.hidden_dim
               : flag == "--output-dim" ? &f->mlp.output_dim
               : flag == "--layers"     ? &f->mlp.layers
                                        : nullptr;
  if (field == nullptr) return false;
  *field = static_cast<int>(parse_between(flag, v, 1, 1 << 30));
  return true;
}

// The GPT-2's flags; false for another flag. A preset sets every size, so it must come before
// the size flags it is combined with (checked in check_model_flags).
bool parse_gpt2_flag(const std::string& flag, const std::string& v, Flags* f) {
  if (flag == "--preset") {
    if (!zero::models::gpt2_preset(v, &f->gpt2)) {
      usage_error("unknown --preset '" + v + "' (" + zero::models::gpt2_preset_names() + ")");
    }
    for (const std::string& given : f->gpt2_flags) {
      if (given == "--n-layer" || given == "--n-head" || given == "--n-embd" ||
          given == "--vocab-size" || given == "--block-size") {
        usage_error("--preset sets every size: give it before " + given);
      }
    }
    return true;
  }
  int* size = flag == "--n-layer"      ? &f->gpt2.n_layer
              : flag == "--n-head"     ? &f->gpt2.n_head
              : flag == "--n-embd"     ? &f->gpt2.n_embd
              : flag == "--vocab-size" ? &f->gpt2.vocab_size
              : flag == "--block-size" ? &f->gpt2.block_size
              : flag == "--seq-len"    ? &f->seq_len
                                       : nullptr;
  if (size != nullptr) {
    *size = static_cast<int>(parse_between(flag, v, 1, 1 << 30));
  } else if (flag == "--data") {
    f->data = v;
  } else if (flag == "--val-data") {
    f->val_data = v;
  } else if (flag == "--val-every") {
    f->val_every = parse_at_least(flag, v, 1);
  } else if (flag == "--val-batches") {
    f->val_batches = parse_at_least(flag, v, 1);
  } else if (flag == "--init-from") {
    f->init_from = v;
  } else if (flag == "--activation-checkpointing") {
    zero::models::Recompute recompute;
    if (!zero::models::parse_recompute(v, &recompute)) {
      usage_error("--activation-checkpointing must be none, selective or full, got '" + v + "'");
    }
    f->activation_checkpointing = v;
  } else if (flag == "--number-checkpoints") {
    f->number_checkpoints = parse_between(flag, v, 1, 1 << 30);
  } else if (flag == "--checkpoint-nvme-path") {
    if (v.empty()) usage_error("--checkpoint-nvme-path needs a directory");
    f->checkpoint_nvme_path = v;
  } else {
    return false;
  }
  return true;
}

// Each model's flags only with that model, and what the GPT-2 needs to run.
void check_model_flags(Flags* f) {
  if (f->model != "mlp" && f->model != "gpt2") {
    usage_error("unknown model '" + f->model + "' (available: mlp, gpt2)");
  }
  const bool gpt2 = f->model == "gpt2";
  const std::vector<std::string>& other = gpt2 ? f->mlp_flags : f->gpt2_flags;
  if (!other.empty()) {
    usage_error(other.front() + " is a flag of --model " + (gpt2 ? "mlp" : "gpt2") +
                ", and this run trains --model " + f->model);
  }
  if (!gpt2) return;
  if (f->data.empty())
    usage_error("--model gpt2 needs --data FILES (token files; see zero-tokenize)");
  if (f->val_every > 0 && f->val_data.empty()) usage_error("--val-every needs --val-data");
  if (f->val_batches && f->val_data.empty()) usage_error("--val-batches needs --val-data");
  if (!f->val_data.empty() && f->val_every == 0) {
    usage_error("--val-data needs --val-every K (validate every K steps)");
  }
  if (f->val_every > f->steps) {
    usage_error("--val-every " + std::to_string(f->val_every) + " is more than --steps " +
                std::to_string(f->steps) + ": no step would validate");
  }
  try {
    zero::models::check_gpt2_config(f->gpt2);
  } catch (const zero::Error& e) {
    usage_error(e.what());
  }
  if (f->seq_len == 0) f->seq_len = f->gpt2.block_size;
  if (f->seq_len > f->gpt2.block_size) {
    usage_error("--seq-len " + std::to_string(f->seq_len) + " is longer than the block size " +
                std::to_string(f->gpt2.block_size) + " (the position embedding's rows)");
  }
}

}  // namespace

int pipeline_virtual_stages(const Flags& f) {
  if (f.pp_virtual_stages) return *f.pp_virtual_stages;
  return zero::parse_pipeline_schedule(f.pp_schedule) == zero::PipelineScheduleKind::kInterleaved
             ? 2
             : 1;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      f.help = true;
      return f;
    }
    if (flag == "--override-optimizer") {
      f.override_optimizer = true;
      continue;
    }
    if (flag == "--pp-regather") {
      f.pp_regather = true;
      continue;
    }
    if (flag == "--decay-all") {
      f.gpt2.decay_matrices_only = false;
      f.gpt2_flags.push_back(flag);
      continue;
    }
    if (flag == "--partition-activations") {
      f.partition_activations = true;
      f.gpt2_flags.push_back(flag);
      continue;
    }
    if (i + 1 >= argc) usage_error("missing value after " + flag);
    const std::string v = argv[++i];
    if (flag == "--config") {
      f.config = v;
    } else if (flag == "--model") {
      f.model = v;
    } else if (flag == "--steps") {
      f.steps = parse_at_least(flag, v, 1);
    } else if (flag == "--stage") {
      f.stage = static_cast<int>(parse_at_least(flag, v, 0));
      if (*f.stage > 3) usage_error("--stage must be 0, 1, 2 or 3");
    } else if (flag == "--tp") {
      f.tp = static_cast<int>(parse_at_least(flag, v, 1));
    } else if (flag == "--pp") {
      f.pp = static_cast<int>(parse_at_least(flag, v, 1));
    } else if (flag == "--pp-schedule") {
      try {
        zero::parse_pipeline_schedule(v);
      } catch (const zero::Error& e) {
        usage_error(std::string("--pp-schedule: ") + e.what());
      }
      f.pp_schedule = v;
    } else if (flag == "--pp-virtual-stages") {
      f.pp_virtual_stages = static_cast<int>(parse_at_least(flag, v, 1));
    } else if (flag == "--pp-partition") {
      if (!is_pipeline_partition_method(v)) {
        usage_error(std::string("--pp-partition must be ") + kPipelinePartitionMethods + ", got '" +
                    v + "'");
      }
      f.pp_partition = v;
    } else if (flag == "--pp-schedule-dump") {
      f.pp_schedule_dump = v;

    } else if (flag == "--dtype") {
      zero::DType dtype;
      if (!zero::parse_dtype(v, &dtype)) usage_error("--dtype must be fp32, bf16 or fp16");
      f.dtype = dtype;
    } else if (flag == "--seed") {
      f.seed = static_cast<uint64_t>(parse_at_least(flag, v, 0));
    } else if (flag == "--global-batch") {
      f.global_batch = parse_at_least(flag, v, 1);
    } else if (flag == "--micro-batches") {
      f.micro_batches = static_cast<int>(parse_at_least(flag, v, 1));
    } else if (flag == "--lr") {
      f.lr = parse_float_at_least(flag, v, 0.0f);
    } else if (flag == "--weight-decay") {
      f.weight_decay = parse_float_at_least(flag, v, 0.0f);
    } else if (flag == "--clip") {
      f.clip = parse_float_at_least(flag, v, 0.0f);
    } else if (flag == "--schedule") {
      if (v != "constant" && v != "warmup" && v != "linear" && v != "cosine") {
        usage_error("unknown schedule '" + v + "' (constant, warmup, linear, cosine)");
      }
      f.schedule = v;
    } else if (flag == "--warmup") {
      f.warmup = parse_at_least(flag, v, 0);
    } else if (flag == "--steps-per-print") {
      f.steps_per_print = parse_at_least(flag, v, 1);
    } else if (flag == "--metrics") {
      f.metrics = v;
    } else if (flag == "--trace") {
      f.trace = v;
    } else if (flag == "--memory-timeline") {
      f.memory_timeline = v;
    } else if (flag == "--memory-summary-every") {
      f.memory_summary_every = parse_at_least(flag, v, 1);
    } else if (parse_mlp_flag(flag, v, &f)) {
      f.mlp_flags.push_back(flag);
    } else if (parse_gpt2_flag(flag, v, &f)) {
      f.gpt2_flags.push_back(flag);
    } else if (flag == "--merge-bytes") {
      f.merge_bytes = static_cast<size_t>(parse_at_least(flag, v, 0));
    } else if (flag == "--threads") {
      f.threads = static_cast<int>(parse_at_least(flag, v, 1));
    } else if (flag == "--device") {
      if (v != "cpu" && v != "cuda") usage_error("--device must be cpu or cuda, got '" + v + "'");
      f.cuda = v == "cuda";
#if !ZERO_HAVE_NCCL
      if (f.cuda) usage_error("--device cuda: this zero-train was built without CUDA and NCCL");
#endif
    } else if (flag == "--inject-fault") {
      f.fault = parse_fault(v);
    } else if (flag == "--save-dir") {
      f.save_dir = v;
    } else if (flag == "--save-every") {
      f.save_every = parse_at_least(flag, v, 1);
    } else if (flag == "--resume") {
      f.resume = v;
    } else if (flag == "--nonfinite") {
      if (v != "error" && v != "skip") usage_error("--nonfinite must be error or skip");
      f.skip_nonfinite = v == "skip";
    } else if (flag == "--memory-limit") {
      f.memory_limit = parse_bytes(flag, v);
    } else if (flag == "--test-comm-delay-us") {
      f.test_comm_delay_us = parse_at_least(flag, v, 0);
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  check_model_flags(&f);
  if (f.save_every > 0 && f.save_dir.empty()) usage_error("--save-every needs --save-dir");
  if (!f.init_from.empty() && !f.resume.empty()) {
    usage_error("--init-from and --resume both give the weights: the checkpoint has them");
  }
  if (f.resume == "latest" && f.save_dir.empty()) {
    usage_error("--resume latest needs --save-dir (the directory whose latest checkpoint to load)");
  }
  if (f.cuda && !f.trace.empty()) {
    usage_error("--trace is CPU-only: on a GPU its host-time spans would show launches, not work");
  }
  if (f.cuda && f.test_comm_delay_us > 0) {
    usage_error("--test-comm-delay-us delays the CPU communication stream; not with --device cuda");
  }
  return f;
}

}  // namespace zero::examples
