// Checks zero-train metrics files (JSON lines) for the end-to-end tests:
//   metrics_check --steps N [--from K] same-losses REL A.jsonl B.jsonl...
//                                    every file's loss at every step equals A's at that step
//                                    within REL relative (0 = bitwise)
//   metrics_check --steps N loss-falls RATIO A.jsonl   the last loss is below RATIO x the first
//   metrics_check --steps N skipped-at STEP A.jsonl    exactly STEP was skipped, every loss finite
//   metrics_check --steps N resident-within FRAC A.jsonl   the measured peak resident memory of
//                                    the last step is within FRAC of the planned one
//   metrics_check --steps N peak-activations A.jsonl   every step's measured peak activation
//                                    bytes equal the counted activations the init record planned
//   metrics_check --steps N block-times LAYERS RECOMPUTING A.jsonl   every step record times
//                                    each of LAYERS blocks' forward and backward (> 0), and the
//                                    recomputation of RECOMPUTING of them (the others null; no
//                                    block_recompute_ms at all when RECOMPUTING is 0)
//   metrics_check --steps N block-synchronizations W0,W1,... A.jsonl   every step record's
//                                    block_synchronizations (synchronize_checkpoint_boundary's
//                                    waits per block) is exactly that list
//   metrics_check --steps N comm-ops A.jsonl     every step record's comm_ops (comms_logger)
//                                    sends bytes that add up to its comm_bytes
//   metrics_check --steps N flops-profile STEP TOKENS A.jsonl   one flops_profile record, of
//                                    STEP: its FLOPs are the init record's flops_per_token times
//                                    TOKENS, its modules' parameters the init record's params
//   metrics_check trace RANKS T.json                  a Chrome trace with compute and collective
//                                                      spans from each of RANKS ranks
// Every metrics file must hold each step of its run once, in order, up to the last one, N: a
// run that stopped early (or skipped or repeated a record) fails every check. The first file
// starts at step 1; the others at step K (default 1), e.g. the tail of a resumed run.
// Exit 0 when the check holds, 1 (with the first difference printed) when it does not, 2 on
// unreadable input.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Metrics {
  int world_size = 0;
  int stage = 0;
  std::vector<long> steps;
  std::vector<double> losses;  // NaN where the record holds null
  std::vector<bool> skipped;
  std::vector<double> loss_scales;
  double planned_resident = 0.0;             // bytes, from the init record
  double peak_resident = 0.0;                // bytes, from the last step record
  double counted_activations_planned = 0.0;  // bytes, from the init record
  std::vector<nlohmann::json> step_records;
};

// Filled from the command line: the step every metrics file must end at (required), and the
// step the files after the first one start at.
long expected_last_step = 0;
long expected_first_step_of_others = 1;

Metrics read_metrics(const std::string& path, long first_step) {
  std::ifstream in(path);
  if (!in) {
    std::cerr << "metrics_check: cannot open " << path << "\n";
    std::exit(2);
  }
  Metrics m;
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.contains("event")) {
      std::cerr << "metrics_check: " << path << ":" << line_number << ": not a metrics record\n";
      std::exit(2);
    }
    if (record["event"] == "init") {
      m.world_size = record.at("world_size").get<int>();
      m.stage = record.at("stage").get<int>();
      m.planned_resident = record.value("planned_resident_bytes", 0.0);
      m.counted_activations_planned = record.value("activation_bytes_counted_planned", 0.0);
    } else if (record["event"] == "step") {
      const auto& loss = record.at("loss");
      m.steps.push_back(record.at("step").get<long>());
      m.losses.push_back(loss.is_null() ? std::nan("") : loss.get<double>());
      m.skipped.push_back(record.value("skipped", false));
      m.loss_scales.push_back(record.value("loss_scale", 1.0));
      m.peak_resident = record.value("peak_resident_bytes", 0.0);
      m.step_records.push_back(record);
    }
  }
  if (m.losses.empty()) {
    std::cerr << "metrics_check: " << path << " has no step records\n";
    std::exit(2);
  }
  // The whole run: steps first_step, first_step + 1, ..., expected_last_step, each once.
  for (size_t i = 0; i < m.steps.size(); ++i) {
    const long expected = first_step + static_cast<long>(i);
    if (m.steps[i] != expected) {
      std::printf("%s: record %zu is step %ld, expected step %ld\n", path.c_str(), i + 1,
                  m.steps[i], expected);
      std::exit(1);
    }
  }
  if (m.steps.back() != expected_last_step) {
    std::printf("%s: the run stopped at step %ld, expected %ld steps (the last one %ld)\n",
                path.c_str(), m.steps.back(), expected_last_step - first_step + 1,
                expected_last_step);
    std::exit(1);
  }
  return m;
}

int same_losses(double rel, const std::vector<std::string>& paths) {
  const Metrics reference = read_metrics(paths[0], 1);
  int failures = 0;
  for (size_t f = 1; f < paths.size(); ++f) {
    const Metrics other = read_metrics(paths[f], expected_first_step_of_others);
    double worst = 0.0;
    bool failed = false;
    for (size_t i = 0; i < other.losses.size() && !failed; ++i) {
      const long step = other.steps[i];
      size_t k = 0;
      while (k < reference.steps.size() && reference.steps[k] != step) ++k;
      if (k == reference.steps.size()) {
        std::printf("%s: step %ld is not in the reference %s\n", paths[f].c_str(), step,
                    paths[0].c_str());
        failed = true;
        break;
      }
      const double a = reference.losses[k];
      const double b = other.losses[i];
      const double diff = a == b ? 0.0 : std::fabs(a - b) / std::max(std::fabs(a), 1e-30);
      worst = std::max(worst, diff);
      if (!(diff <= rel)) {
        std::printf(
            "%s (N=%d, stage %d): step %ld loss %.9g vs %.9g (N=%d, stage %d): "
            "relative difference %.3g > %.3g\n",
            paths[f].c_str(), other.world_size, other.stage, step, b, a, reference.world_size,
            reference.stage, diff, rel);
        failed = true;
      }
    }
    failures += failed ? 1 : 0;
    std::printf("%s (N=%d, stage %d): %zu steps, worst relative difference %.3g\n",
                paths[f].c_str(), other.world_size, other.stage, other.losses.size(), worst);
  }
  return failures == 0 ? 0 : 1;
}

int loss_falls(double ratio, const std::string& path) {
  const Metrics m = read_metrics(path, 1);
  const double first = m.losses.front();
  const double last = m.losses.back();
  std::printf("%s: first loss %.6g, last loss %.6g after %zu steps (ratio %.3f, limit %.3f)\n",
              path.c_str(), first, last, m.losses.size(), last / first, ratio);
  return last < ratio * first ? 0 : 1;
}

int resident_within(double fraction, const std::string& path) {
  const Metrics m = read_metrics(path, 1);
  const double mib = 1024.0 * 1024.0;
  const double off = m.peak_resident / m.planned_resident - 1.0;
  std::printf("%s: peak resident %.1f MiB, planned %.1f MiB (%+.1f %%, limit %.0f %%)\n",
              path.c_str(), m.peak_resident / mib, m.planned_resident / mib, 100.0 * off,
              100.0 * fraction);
  return m.planned_resident > 0.0 && std::fabs(off) <= fraction ? 0 : 1;
}

int peak_activations(const std::string& path) {
  const Metrics m = read_metrics(path, 1);
  const double planned = m.counted_activations_planned;
  int failures = planned > 0.0 ? 0 : 1;
  for (const nlohmann::json& record : m.step_records) {
    const double peak = record.value("peak_activation_bytes", -1.0);
    if (peak != planned) {
      std::printf("%s: step %ld: peak activations %.0f bytes, planned %.0f\n", path.c_str(),
                  record.at("step").get<long>(), peak, planned);
      ++failures;
    }
  }
  std::printf("%s: %zu steps, peak activations planned %.0f bytes: %s\n", path.c_str(),
              m.step_records.size(), planned, failures == 0 ? "every step equal" : "differ");
  return failures == 0 ? 0 : 1;
}

// The values of `key` in a step record: LAYERS numbers > 0, or nulls where allowed.
int check_times(const nlohmann::json& record, const char* key, size_t layers, size_t* nulls) {
  const long step = record.at("step").get<long>();
  if (!record.contains(key) || !record[key].is_array() || record[key].size() != layers) {
    std::printf("step %ld: %s is not a list of %zu block times\n", step, key, layers);
    return 1;
  }
  int failures = 0;
  for (const nlohmann::json& value : record[key]) {
    if (value.is_null() && nulls != nullptr) {
      ++*nulls;
    } else if (!value.is_number() || !(value.get<double>() > 0.0)) {
      std::printf("step %ld: %s holds %s, not a time > 0\n", step, key, value.dump().c_str());
      ++failures;
    }
  }
  return failures;
}

int block_times(size_t layers, size_t recomputing, const std::string& path) {
  const Metrics m = read_metrics(path, 1);
  int failures = 0;
  for (const nlohmann::json& record : m.step_records) {
    failures += check_times(record, "block_forward_ms", layers, nullptr);
    failures += check_times(record, "block_backward_ms", layers, nullptr);
    if (recomputing == 0) {
      if (record.contains("block_recompute_ms")) {
        std::printf("step %ld: block_recompute_ms without recomputation\n",
                    record.at("step").get<long>());
        ++failures;
      }
      continue;
    }
    size_t nulls = 0;
    failures += check_times(record, "block_recompute_ms", layers, &nulls);
    if (nulls != layers - recomputing) {
      std::printf("step %ld: %zu blocks without a recomputation time, expected %zu\n",
                  record.at("step").get<long>(), nulls, layers - recomputing);
      ++failures;
    }
  }
  std::printf("%s: %zu steps, times of %zu blocks (%zu recomputing): %s\n", path.c_str(),
              m.step_records.size(), layers, recomputing, failures == 0 ? "all there" : "wrong");
  return failures == 0 ? 0 : 1;
}

int block_synchronizations(const std::string& list, const std::string& path) {
  nlohmann::json expected = nlohmann::json::array();
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) {
    char* end = nullptr;
    const long waits = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || waits < 0) {
      std::printf("block-synchronizations: '%s' in '%s' is not a count\n", item.c_str(),
                  list.c_str());
      return 2;
    }
    expected.push_back(waits);
  }
  const Metrics m = read_metrics(path, 1);
  int failures = 0;
  for (const nlohmann::json& record : m.step_records) {
    const nlohmann::json got = record.value("block_synchronizations", nlohmann::json());
    if (got != expected) {
      std::printf("step %ld: block_synchronizations %s, expected %s\n",
                  record.at("step").get<long>(), got.dump().c_str(), expected.dump().c_str());
      ++failures;
    }
  }
  std::printf("%s: %zu steps, block_synchronizations %s: %s\n", path.c_str(), m.step_records.size(),
              expected.dump().c_str(), failures == 0 ? "as expected" : "wrong");
  return failures == 0 ? 0 : 1;
}

int skipped_at(long step, const std::string& path) {
  const Metrics m = read_metrics(path, 1);
  int failures = 0;
  for (size_t i = 0; i < m.losses.size(); ++i) {
    const bool expected = static_cast<long>(i) + 1 == step;
    if (m.skipped[i] != expected) {
      std::printf("%s: step %zu %s skipped\n", path.c_str(), i + 1, expected ? "was not" : "was");
      ++failures;
    }
    if (!std::isfinite(m.losses[i])) {
      std::printf("%s: step %zu loss is not finite\n", path.c_str(), i + 1);
      ++failures;
    }
  }
  std::printf("%s: %zu steps, skipped only at step %ld: %s\n", path.c_str(), m.losses.size(), step,
              failures == 0 ? "yes" : "no");
  return failures == 0 ? 0 : 1;
}

int comm_ops_add_up(const std::string& path) {
  const Metrics m = read_metrics(path, 1);
  int failures = 0;
  for (const nlohmann::json& r : m.step_records) {
    uint64_t sent = 0;
    const nlohmann::json ops = r.value("comm_ops", nlohmann::json::object());
    for (const auto& op : ops.items()) {
      sent += op.value().at("sent_bytes").get<uint64_t>();
    }
    if (sent == 0 || sent != r.at("comm_bytes").get<uint64_t>()) {
      std::printf("%s: step %ld: comm_ops send %llu bytes, comm_bytes is %s\n", path.c_str(),
                  r.at("step").get<long>(), static_cast<unsigned long long>(sent),
                  r.at("comm_bytes").dump().c_str());
      ++failures;
    }
  }
  std::printf("%s: %zu steps, comm_ops add up to comm_bytes: %s\n", path.c_str(),
              m.step_records.size(), failures == 0 ? "yes" : "no");
  return failures == 0 ? 0 : 1;
}

int flops_profile_matches(long step, double tokens, const std::string& path) {
  read_metrics(path, 1);  // the step records are whole
  std::ifstream in(path);
  nlohmann::json init, profile;
  int profiles = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("event", "") == "init") init = record;
    if (record.value("event", "") == "flops_profile") {
      profile = record;
      ++profiles;
    }
  }
  if (profiles != 1 || profile.at("step").get<long>() != step) {
    std::printf("%s: %d flops_profile records, expected one of step %ld\n", path.c_str(), profiles,
                step);
    return 1;
  }
  const double expected = init.at("flops_per_token").get<double>() * tokens;
  double module_flops = 0, params = 0;
  for (const auto& m : profile.at("modules")) {
    module_flops += m.at("forward_flops").get<double>() + m.at("backward_flops").get<double>();
    params += m.at("params").get<double>();
  }
  const double total = profile.at("total_flops").get<double>();
  const bool ok = total == expected && module_flops == total &&
                  params == init.at("params").get<double>() &&
                  profile.at("tokens").get<double>() == tokens;
  std::printf(
      "%s: flops profile of step %ld: %.0f FLOPs (flops_per_token x %.0f tokens = %.0f), "
      "modules %.0f, params %.0f: %s\n",
      path.c_str(), step, total, tokens, expected, module_flops, params,
      ok ? "as expected" : "wrong");
  return ok ? 0 : 1;
}

int trace_has_every_rank(int ranks, const std::string& path) {
  std::ifstream in(path);
  nlohmann::json trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (trace.is_discarded() || !trace.contains("traceEvents")) {
    std::printf("%s: not a Chrome trace (JSON with traceEvents)\n", path.c_str());
    return 1;
  }
  std::vector<int> compute(ranks, 0), collective(ranks, 0);
  for (const auto& event : trace["traceEvents"]) {
    if (event.value("ph", "") != "X") continue;
    const int pid = event.value("pid", -1);
    if (pid < 0 || pid >= ranks || !(event.value("dur", -1.0) >= 0.0)) {
      std::printf("%s: bad span %s\n", path.c_str(), event.dump().c_str());
      return 1;
    }
    (event.value("cat", "") == "collective" ? collective : compute)[pid] += 1;
  }
  int failures = 0;
  for (int r = 0; r < ranks; ++r) {
    std::printf("%s: rank %d: %d compute spans, %d collective spans\n", path.c_str(), r, compute[r],
                collective[r]);
    if (compute[r] == 0 || collective[r] == 0) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int usage() {
  std::cerr << "usage: metrics_check --steps N [--from K] same-losses REL A.jsonl B.jsonl...\n"
               "       metrics_check --steps N loss-falls RATIO A.jsonl\n"
               "       metrics_check --steps N skipped-at STEP A.jsonl\n"
               "       metrics_check --steps N resident-within FRAC A.jsonl\n"
               "       metrics_check --steps N peak-activations A.jsonl\n"
               "       metrics_check --steps N block-times LAYERS RECOMPUTING A.jsonl\n"
               "       metrics_check --steps N block-synchronizations W0,W1,... A.jsonl\n"
               "       metrics_check --steps N comm-ops A.jsonl\n"
               "       metrics_check --steps N flops-profile STEP TOKENS A.jsonl\n"
               "       metrics_check trace RANKS T.json\n";
  return 2;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "trace") {
    return trace_has_every_rank(std::atoi(args[1].c_str()), args[2]);
  }
  // The metrics modes: --steps is required, so no check can accept a run that stopped early.
  size_t a = 0;
  while (a + 1 < args.size() && (args[a] == "--steps" || args[a] == "--from")) {
    const long value = std::atol(args[a + 1].c_str());
    (args[a] == "--steps" ? expected_last_step : expected_first_step_of_others) = value;
    a += 2;
  }
  if (expected_last_step < 1 || expected_first_step_of_others < 1 ||
      expected_first_step_of_others > expected_last_step) {
    return usage();
  }
  args.erase(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(a));
  if (args.size() >= 4 && args[0] == "same-losses") {
    return same_losses(std::atof(args[1].c_str()),
                       std::vector<std::string>(args.begin() + 2, args.end()));
  }
  if (args.size() == 3 && args[0] == "loss-falls") {
    return loss_falls(std::atof(args[1].c_str()), args[2]);
  }
  if (args.size() == 3 && args[0] == "resident-within") {
    return resident_within(std::atof(args[1].c_str()), args[2]);
  }
  if (args.size() == 2 && args[0] == "peak-activations") return peak_activations(args[1]);
  if (args.size() == 2 && args[0] == "comm-ops") return comm_ops_add_up(args[1]);
  if (args.size() == 4 && args[0] == "flops-profile") {
    return flops_profile_matches(std::atol(args[1].c_str()), std::atof(args[2].c_str()), args[3]);
  }
  if (args.size() == 4 && args[0] == "block-times") {
    const long layers = std::atol(args[1].c_str());
    const long recomputing = std::atol(args[2].c_str());
    if (layers < 1 || recomputing < 0 || recomputing > layers) return usage();
    return block_times(static_cast<size_t>(layers), static_cast<size_t>(recomputing), args[3]);
  }
  if (args.size() == 3 && args[0] == "block-synchronizations") {
    return block_synchronizations(args[1], args[2]);
  }
  if (args.size() == 3 && args[0] == "skipped-at") {
    const long step = std::atol(args[1].c_str());
    if (step < 1 || step > expected_last_step) return usage();
    return skipped_at(step, args[2]);
  }
  return usage();
}
