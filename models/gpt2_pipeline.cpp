// The GPT-2 cut into pipeline stages: which layers each stage holds (by parameters, uniformly,
// or by the layers whose type matches), and one stage's place in the cut.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "zero/core/check.h"
#include "zero/core/text.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero::models {

std::vector<int> gpt2_pipeline_partition(const Gpt2Config& config, int stages,
                                         const std::string& method, int seq_len) {
  const int L = config.n_layer;
  ZERO_CHECK(stages >= 1 && stages <= L, "a GPT-2 of " << L << " layers cannot be cut into "
                                                       << stages
                                                       << " pipeline stages of at least one "
                                                          "block each");
  std::vector<int> bounds(static_cast<size_t>(stages) + 1, 0);
  if (method == "uniform") {
    ZERO_CHECK(L % stages == 0, "--pp-partition uniform: " << stages
                                                           << " pipeline stages do not divide the "
                                                           << L << " layers (n_layer)");
    for (int s = 0; s <= stages; ++s) bounds[static_cast<size_t>(s)] = s * (L / stages);
    return bounds;
  }
  ZERO_CHECK(is_pipeline_partition_method(method), "unknown pipeline partition method '"
                                                       << method << "' ("
                                                       << kPipelinePartitionMethods << ")");
  const bool by_type = method.rfind("type:", 0) == 0;
  // What each layer weighs: with "parameters" its parameters (one rank's slices: blocks alike,
  // the embeddings before the first, ln_f and wte after the last); with "type:REGEX" 1 when its
  // type name (Gpt2Embedding, Gpt2Block, Gpt2Head) matches, ignoring case, as DeepSpeed counts
  // the layers whose class matches; with "flops" its FLOPs per token (every rank's share alike
  // under tensor parallelism, so the whole model's).
  uint64_t embedding = 0, block = 0, head = 0;
  if (by_type) {
    std::regex pattern;
    try {
      pattern = std::regex(method.substr(5), std::regex::icase);
    } catch (const std::regex_error& e) {
      ZERO_FAIL("pipeline partition '" << method << "': not a regular expression (" << e.what()
                                       << ")");
    }
    embedding = std::regex_search("Gpt2Embedding", pattern) ? 1 : 0;
    block = std::regex_search("Gpt2Block", pattern) ? 1 : 0;
    head = std::regex_search("Gpt2Head", pattern) ? 1 : 0;
    ZERO_CHECK(embedding + block + head > 0,
               "pipeline partition '" << method
                                      << "' matches no layer type (Gpt2Embedding, Gpt2Block, "
                                         "Gpt2Head)");
  }
  if (method == "flops") {
    // Per token, forward and backward: 2 + 4 FLOPs per weight of a product.
    const uint64_t C = static_cast<uint64_t>(config.n_embd);
    const uint64_t T = static_cast<uint64_t>(seq_len > 0 ? seq_len : config.block_size);
    block = 6 * 12 * C * C + 12 * C * T;
    head = 6 * static_cast<uint64_t>(config.vocab_size) * C;
  }
  const bool by_parameters = method == "parameters";
  for (const ParamSpec& spec :
       by_parameters ? gpt2_param_specs(config) : std::vector<ParamSpec>{}) {
    uint64_t n = 1;
    for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
    if (spec.name.compare(0, 2, "h.") == 0) {
      if (spec.name.compare(0, 4, "h.0.") == 0) block += n;
    } else if (spec.name.compare(0, 5, "ln_f.") == 0) {
      head += n;
    } else {
      embedding += n;
      if (spec.name == "wte.weight") head += n;
    }
  }
  const auto weight = [&](int stage, int first, int end) {
    return (stage == 0 ? embedding : 0) + (stage == stages - 1 ? head : 0) +
           block * static_cast<uint64_t>(end - first);
  };
  // Two passes over cuts of layers [0, l) into stages 0..s-1: the least possible largest stage,
  // then, among the cuts within it, the one with the least sum of squared stage weights (the
  // most even, so the middle stages do not differ by more than they must).
  const size_t S = static_cast<size_t>(stages), N = static_cast<size_t>(L);
  const double kNone = std::numeric_limits<double>::infinity();
  const auto cheapest = [&](const std::function<double(double before, double stage)>& combine,
                            double cap, std::vector<std::vector<int>>* cut) {
    std::vector<std::vector<double>> best(S + 1, std::vector<double>(N + 1, kNone));
    cut->assign(S + 1, std::vector<int>(N + 1, 0));
    best[0][0] = 0.0;
    for (int s = 1; s <= stages; ++s) {
      for (int l = s; l <= L; ++l) {
        for (int k = s - 1; k < l; ++k) {
          const double before = best[static_cast<size_t>(s - 1)][static_cast<size_t>(k)];
          const double w = static_cast<double>(weight(s - 1, k, l));
          if (before == kNone || w > cap) continue;
          const double total = combine(before, w);
          if (total < best[static_cast<size_t>(s)][static_cast<size_t>(l)]) {
            best[static_cast<size_t>(s)][static_cast<size_t>(l)] = total;
            (*cut)[static_cast<size_t>(s)][static_cast<size_t>(l)] = k;
          }
        }
      }
    }
    return best[S][N];
  };
  std::vector<std::vector<int>> cut;
  const double largest = cheapest([](double a, double w) { return std::max(a, w); }, kNone, &cut);
  cheapest([](double a, double w) { return a + w * w; }, largest, &cut);
  bounds[S] = L;
  for (size_t s = S; s > 0; --s) {
    bounds[s - 1] = cut[s][static_cast<size_t>(bounds[s])];
  }
  return bounds;
}

Gpt2PipelineStage gpt2_pipeline_stage(const Gpt2Config& config, const std::vector<int>& partition,
                                      int stage, int virtual_stages) {
  ZERO_CHECK(virtual_stages >= 1,
             "virtual stages (model chunks per pipeline stage) must be at least 1, got "
                 << virtual_stages);
  const int cuts = static_cast<int>(partition.size()) - 1;
  ZERO_CHECK(cuts >= 1 && partition.front() == 0 && partition.back() == config.n_layer,
             "a GPT-2 pipeline partition runs from layer 0 to n_layer ("
                 << config.n_layer << "), got "
                 << "[" << join(partition, ", ") << "]");
  for (int s = 0; s < cuts; ++s) {
    ZERO_CHECK(partition[s] <= partition[s + 1],
               "a GPT-2 pipeline partition must not decrease, got "
                   << "[" << join(partition, ", ") << "]");
  }
  ZERO_CHECK(cuts % virtual_stages == 0, "a GPT-2 pipeline partition into "
                                             << cuts << " parts is not " << virtual_stages
                                             << " chunks per stage");
  const int stages = cuts / virtual_stages;
  ZERO_CHECK(stage >= 0 && stage < stages,
             "pipeline stage " << stage << " of a partition into " << stages << " stages");
  Gpt2PipelineStage result{stage, stages, partition[stage], partition[stage + 1], {}};
  if (virtual_stages > 1) {
    for (int c = 0; c < virtual_stages; ++c) {
      const int v = c * stages + stage;
      result.chunks.emplace_back(partition[v], partition[v + 1]);
    }
    result.first_layer = result.chunks.front().first;
    result.end_layer = result.chunks.back().second;
  }
  return result;
}

std::pair<int, int> Gpt2PipelineStage::chunk_layers(int chunk, int n_layer) const {
  ZERO_CHECK(chunk >= 0 && chunk < chunk_count(),
             "chunk " << chunk << " of a pipeline stage of " << chunk_count() << " chunk(s)");
  const std::pair<int, int> layers =
      !chunks.empty() ? chunks[static_cast<size_t>(chunk)]
                      : std::make_pair(first_layer, end_layer < 0 ? n_layer : end_layer);
  ZERO_CHECK(0 <= layers.first && layers.first <= layers.second && layers.second <= n_layer,
             "GPT-2 pipeline stage " << stage << " holds layers " << layers.first << " to "
                                     << layers.second << " of " << n_layer);
  return layers;
}

std::string Gpt2PipelineStage::describe_layers(int n_layer) const {
  std::string text;
  for (int c = 0; c < chunk_count(); ++c) {
    const std::pair<int, int> layers = chunk_layers(c, n_layer);
    text += (c == 0 ? "" : ", ") + std::to_string(layers.first) + "-" +
            std::to_string(layers.second - 1);
  }
  return text;
}

}  // namespace zero::models
