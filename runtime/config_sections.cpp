// The optimizer and scheduler sections of the config -> OptimizerConfig and LrScheduleConfig,
// with DeepSpeed's and PyTorch's defaults for absent parameters (config.h).
#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config_parse.h"

namespace zero::config_internal {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Rejects every parameter given in `params` that `type_name` does not take.
void check_params_taken(const Message& params, const std::vector<std::string>& takes,
                        const std::string& section, const std::string& type_name,
                        const std::string& origin) {
  std::vector<const FieldDescriptor*> given;
  params.GetReflection()->ListFields(params, &given);
  for (const FieldDescriptor* field : given) {
    if (std::find(takes.begin(), takes.end(), field->name()) == takes.end()) {
      config_error(in_quotes(section + "." + field->name()) + " in " + origin +
                   " is not a parameter of " + type_name + " (it takes " + join(takes, ", ") + ")");
    }
  }
}

}  // namespace

void read_optimizer(const config::Optimizer& section, const Checker& check, OptimizerConfig* out) {
  const std::string& origin = check.origin();
  if (!section.has_type()) {
    config_error("\"optimizer.type\" is missing in " + origin + "; expected Adam, AdamW or SGD");
  }
  const config::OptimizerParams& params = section.params();
  // DeepSpeed hands params to its FusedAdam or to torch.optim.SGD: their defaults apply.
  OptimizerConfig optimizer;
  optimizer.weight_decay = 0.0f;
  OptimizerType named = OptimizerType::kAdamW;
  if (!parse_optimizer_type_name(section.type(), &named)) {
    static const std::set<std::string> deepspeed_only = {"adagrad",    "lamb",       "lion",
                                                         "muadam",     "muadamw",    "musgd",
                                                         "onebitadam", "onebitlamb", "zerooneadam"};
    if (deepspeed_only.count(lower(section.type())) != 0) {
      config_error("\"optimizer.type\" in " + origin + " is " + in_quotes(section.type()) +
                   ", a DeepSpeed optimizer this runtime does not support yet (supported: "
                   "Adam, AdamW, SGD)");
    }
    check.fail("optimizer.type", "Adam, AdamW or SGD", in_quotes(section.type()));
  }
  const std::string type_name = optimizer_type_name(named);
  if (named == OptimizerType::kSgd) {
    check_params_taken(params, {"lr", "momentum", "weight_decay"}, "optimizer.params", type_name,
                       origin);
    optimizer.type = OptimizerType::kSgd;
  } else {
    check_params_taken(params, {"lr", "betas", "eps", "weight_decay", "adam_w_mode"},
                       "optimizer.params", type_name, origin);
    // DeepSpeed's Adam is AdamW unless adam_w_mode says otherwise.
    optimizer.type = OptimizerType::kAdamW;
    if (params.has_adam_w_mode() && !params.adam_w_mode()) {
      if (named == OptimizerType::kAdamW) {
        config_error(
            "\"optimizer.params.adam_w_mode\" in " + origin +
            " is false, but the type is AdamW; use type Adam for Adam with L2 weight decay");
      }
      optimizer.type = OptimizerType::kAdam;
    }
  }

  if (params.has_lr()) {
    optimizer.lr = check.real("optimizer.params.lr", params.lr(), params.lr() >= 0, ">= 0");
  }
  if (params.betas_size() != 0) {
    if (params.betas_size() != 2) {
      check.fail("optimizer.params.betas", "two numbers", std::to_string(params.betas_size()));
    }
    double* betas[2] = {&optimizer.beta1, &optimizer.beta2};
    for (int i = 0; i < 2; ++i) {
      const double beta = params.betas(i);
      // Checked as the optimizer will use it: 1 - beta must stay positive in fp32.
      if (!(beta >= 0.0 && static_cast<float>(beta) < 1.0f)) {
        check.fail("optimizer.params.betas[" + std::to_string(i) + "]", "in [0, 1)",
                   number_text(beta));
      }
      *betas[i] = beta;
    }
  }
  if (params.has_eps()) {
    optimizer.eps = check.real("optimizer.params.eps", params.eps(), params.eps() > 0, "> 0");
  }
  if (params.has_weight_decay()) {
    optimizer.weight_decay = check.real("optimizer.params.weight_decay", params.weight_decay(),
                                        params.weight_decay() >= 0, ">= 0");
  }
  if (params.has_momentum()) {
    const double m = params.momentum();
    optimizer.momentum = check.real("optimizer.params.momentum", m,
                                    m >= 0 && static_cast<float>(m) < 1.0f, "in [0, 1)");
  }
  *out = optimizer;
}

void read_scheduler(const config::Scheduler& section, float optimizer_lr, const Checker& check,
                    LrScheduleConfig* out) {
  const std::string& origin = check.origin();
  if (!section.has_type()) {
    config_error("\"scheduler.type\" is missing in " + origin +
                 "; expected WarmupLR, WarmupDecayLR or WarmupCosineLR");
  }
  const config::SchedulerParams& params = section.params();
  LrScheduleConfig schedule;
  // "constant" names no scheduler here, not a DeepSpeed scheduler type.
  if (!parse_lr_schedule_type_name(section.type(), &schedule.type) ||
      schedule.type == LrScheduleType::kConstant) {
    const std::string type = lower(section.type());
    if (type == "onecycle" || type == "lrrangetest") {
      config_error("\"scheduler.type\" in " + origin + " is " + in_quotes(section.type()) +
                   ", a DeepSpeed scheduler this runtime does not support yet (supported: "
                   "WarmupLR, WarmupDecayLR, WarmupCosineLR)");
    }
    check.fail("scheduler.type", "WarmupLR, WarmupDecayLR or WarmupCosineLR",
               in_quotes(section.type()));
  }
  const std::string type_name = lr_schedule_type_name(schedule.type);
  if (schedule.type == LrScheduleType::kWarmup) {
    check_params_taken(params,
                       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"},
                       "scheduler.params", type_name, origin);
  } else if (schedule.type == LrScheduleType::kWarmupLinearDecay) {
    check_params_taken(
        params,
        {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"},
        "scheduler.params", type_name, origin);
  } else {
    check_params_taken(
        params,
        {"total_num_steps", "warmup_min_ratio", "cos_min_ratio", "warmup_num_steps", "warmup_type"},
        "scheduler.params", type_name, origin);
  }

  // DeepSpeed's default warm-up is "log". (DeepSpeed falls back to it, with a warning, for a
  // name it does not know; a typo here is an error instead.)
  if (params.has_warmup_type() &&
      !parse_lr_warmup_type(params.warmup_type(), &schedule.warmup_type)) {
    check.fail("scheduler.params.warmup_type", "\"log\" or \"linear\"",
               in_quotes(params.warmup_type()));
  }
  schedule.warmup_steps = params.has_warmup_num_steps()
                              ? check.integer("scheduler.params.warmup_num_steps",
                                              params.warmup_num_steps(), 0, kMaxInt64)
                              : 1000;
  if (schedule.type == LrScheduleType::kWarmupCosine) {
    // WarmupCosineLR scales the optimizer's own lr.
    const double min_ratio = params.has_warmup_min_ratio() ? params.warmup_min_ratio() : 0.0;
    const double cos_ratio = params.has_cos_min_ratio() ? params.cos_min_ratio() : 1e-4;
    check.real("scheduler.params.warmup_min_ratio", min_ratio, min_ratio >= 0 && min_ratio <= 1,
               "in [0, 1]");
    schedule.cos_min_ratio = check.real("scheduler.params.cos_min_ratio", cos_ratio,
                                        cos_ratio >= 0 && cos_ratio <= 1, "in [0, 1]");
    schedule.max_lr = optimizer_lr;
    schedule.min_lr = static_cast<float>(min_ratio * optimizer_lr);
  } else {
    const double min_lr = params.has_warmup_min_lr() ? params.warmup_min_lr() : 0.0;
    const double max_lr = params.has_warmup_max_lr() ? params.warmup_max_lr() : 1e-3;
    schedule.min_lr = check.real("scheduler.params.warmup_min_lr", min_lr, min_lr >= 0, ">= 0");
    schedule.max_lr = check.real("scheduler.params.warmup_max_lr", max_lr, max_lr >= 0, ">= 0");
    if (min_lr > max_lr) {
      config_error("\"scheduler.params.warmup_min_lr\" (" + number_text(min_lr) + ") exceeds " +
                   "\"scheduler.params.warmup_max_lr\" (" + number_text(max_lr) + ") in " + origin);
    }
  }
  if (schedule.type != LrScheduleType::kWarmup) {
    if (!params.has_total_num_steps()) {
      config_error("\"scheduler.params.total_num_steps\" is missing in " + origin + "; " +
                   type_name + " needs it");
    }
    schedule.total_steps =
        check.integer("scheduler.params.total_num_steps", params.total_num_steps(), 1, kMaxInt64);
    if (schedule.warmup_steps > schedule.total_steps) {
      config_error("\"scheduler.params.warmup_num_steps\" (" +
                   std::to_string(schedule.warmup_steps) +
                   (params.has_warmup_num_steps() ? "" : ", the default") + ") exceeds " +
                   "\"scheduler.params.total_num_steps\" (" + std::to_string(schedule.total_steps) +
                   ") in " + origin);
    }
  }
  *out = schedule;
}

}  // namespace zero::config_internal
