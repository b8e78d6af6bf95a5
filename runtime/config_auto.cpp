// "auto" in a JSON config, resolved from the run as Hugging Face's Trainer does (config.h).
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "config_parse.h"

namespace zero::config_internal {

void resolve_auto(const std::set<std::string>& auto_keys, const ConfigContext& context,
                  int world_size, const std::string& origin, config::TrainingConfig* c,
                  std::vector<std::string>* notes) {
  const auto is_auto = [&](const char* key) { return auto_keys.count(key) != 0; };
  const auto unresolved = [&](const char* key, const std::string& needs) {
    config_error(in_quotes(key) + " in " + origin + " is \"auto\", but " + needs +
                 " is not known here; give the key a value");
  };
  const auto note = [&](const char* key, const std::string& value, const std::string& why) {
    notes->push_back(std::string(key) + " \"auto\" -> " + value + " (" + why + ")");
  };
  const std::string& from = context.source;

  if (is_auto("pipeline.stages")) {
    const long stages = context.pipeline_stages.value_or(1);
    c->mutable_pipeline()->set_stages(stages);
    note("pipeline.stages", std::to_string(stages),
         context.pipeline_stages ? from : "no pipeline asked for");
  }
  if (is_auto("train_batch_size")) {
    if (!context.train_batch_size) unresolved("train_batch_size", "the run's global batch size");
    c->set_train_batch_size(*context.train_batch_size);
    note("train_batch_size", std::to_string(*context.train_batch_size), from);
  }
  if (is_auto("gradient_accumulation_steps")) {
    if (!context.gradient_accumulation_steps) {
      unresolved("gradient_accumulation_steps", "the run's number of micro-batches");
    }
    c->set_gradient_accumulation_steps(*context.gradient_accumulation_steps);
    note("gradient_accumulation_steps", std::to_string(*context.gradient_accumulation_steps), from);
  }
  if (is_auto("train_micro_batch_size_per_gpu")) {
    if (!context.train_batch_size || !context.gradient_accumulation_steps) {
      unresolved("train_micro_batch_size_per_gpu", "the run's global batch and micro-batches");
    }
    const BatchSizes b = derive_batch_sizes(context.train_batch_size, std::nullopt,
                                            context.gradient_accumulation_steps, world_size, from);
    c->set_train_micro_batch_size_per_gpu(b.micro_batch_per_rank);
    note("train_micro_batch_size_per_gpu", std::to_string(b.micro_batch_per_rank),
         "global batch " + std::to_string(b.train_batch_size) + " / (" +
             std::to_string(b.gradient_accumulation_steps) + " micro-batches x " +
             std::to_string(world_size) + " ranks)");
  }
  if (is_auto("gradient_clipping")) {
    if (!context.gradient_clipping) unresolved("gradient_clipping", "the run's clipping norm");
    c->set_gradient_clipping(*context.gradient_clipping);
    note("gradient_clipping", number_text(*context.gradient_clipping), from);
  }
  for (const char* key : {"fp16.enabled", "bf16.enabled"}) {
    if (!is_auto(key)) continue;
    if (!context.dtype) unresolved(key, "the run's dtype");
    const bool fp16 = std::string(key) == "fp16.enabled";
    const bool on = *context.dtype == (fp16 ? DType::kFloat16 : DType::kBFloat16);
    if (fp16) {
      c->mutable_fp16()->set_enabled(on);
    } else {
      c->mutable_bf16()->set_enabled(on);
    }
    note(key, on ? "true" : "false", std::string("dtype ") + dtype_name(*context.dtype));
  }

  // Sections are only touched where the file has an "auto" in them: a section that exists is
  // one the file gave.
  const auto optimizer = [&] { return c->mutable_optimizer()->mutable_params(); };
  if (is_auto("optimizer.params.lr")) {
    if (!context.lr) unresolved("optimizer.params.lr", "the run's learning rate");
    optimizer()->set_lr(*context.lr);
    note("optimizer.params.lr", number_text(*context.lr), from);
  }
  if (is_auto("optimizer.params.betas")) {
    optimizer()->add_betas(0.9);
    optimizer()->add_betas(0.999);
    note("optimizer.params.betas", "[0.9, 0.999]", "Adam's default");
  }
  if (is_auto("optimizer.params.eps")) {
    optimizer()->set_eps(1e-8);
    note("optimizer.params.eps", "1e-08", "Adam's default");
  }
  if (is_auto("optimizer.params.weight_decay")) {
    if (!context.weight_decay)
      unresolved("optimizer.params.weight_decay", "the run's weight decay");
    optimizer()->set_weight_decay(*context.weight_decay);
    note("optimizer.params.weight_decay", number_text(*context.weight_decay), from);
  }

  const auto scheduler = [&] { return c->mutable_scheduler()->mutable_params(); };
  if (is_auto("scheduler.params.warmup_min_lr")) {
    scheduler()->set_warmup_min_lr(0.0);
    note("scheduler.params.warmup_min_lr", "0", "Hugging Face's value");
  }
  if (is_auto("scheduler.params.warmup_max_lr")) {
    if (!context.lr) unresolved("scheduler.params.warmup_max_lr", "the run's learning rate");
    scheduler()->set_warmup_max_lr(*context.lr);
    note("scheduler.params.warmup_max_lr", number_text(*context.lr), "the run's learning rate");
  }
  if (is_auto("scheduler.params.warmup_num_steps")) {
    if (!context.warmup_num_steps) {
      unresolved("scheduler.params.warmup_num_steps", "the run's warm-up steps");
    }
    scheduler()->set_warmup_num_steps(*context.warmup_num_steps);
    note("scheduler.params.warmup_num_steps", std::to_string(*context.warmup_num_steps), from);
  }
  if (is_auto("scheduler.params.total_num_steps")) {
    if (!context.total_num_steps) {
      unresolved("scheduler.params.total_num_steps", "the run's number of steps");
    }
    scheduler()->set_total_num_steps(*context.total_num_steps);
    note("scheduler.params.total_num_steps", std::to_string(*context.total_num_steps), from);
  }

  // The bucket sizes scale with the model: Hugging Face's trainer_config_finalize.
  config::ZeroOptimization* zero = c->mutable_zero_optimization();
  const char* hidden_keys[] = {"zero_optimization.reduce_bucket_size",
                               "zero_optimization.stage3_prefetch_bucket_size",
                               "zero_optimization.stage3_param_persistence_threshold"};
  for (const char* key : hidden_keys) {
    if (is_auto(key) && !context.hidden_size) unresolved(key, "the model's hidden size");
  }
  if (context.hidden_size) {
    const int64_t h = *context.hidden_size;
    const std::string hidden = "hidden " + std::to_string(h);
    if (is_auto(hidden_keys[0])) {
      zero->set_reduce_bucket_size(h * h);
      note(hidden_keys[0], std::to_string(h * h), hidden + " squared");
    }
    if (is_auto(hidden_keys[1])) {
      const int64_t v = static_cast<int64_t>(0.9 * static_cast<double>(h * h));
      zero->set_stage3_prefetch_bucket_size(v);
      note(hidden_keys[1], std::to_string(v), "0.9 x " + hidden + " squared");
    }
    if (is_auto(hidden_keys[2])) {
      zero->set_stage3_param_persistence_threshold(10 * h);
      note(hidden_keys[2], std::to_string(10 * h), "10 x " + hidden);
    }
  }
}

}  // namespace zero::config_internal
