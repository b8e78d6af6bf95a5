// Checks zero-train metrics files (JSON lines) for the end-to-end tests:
//   metrics_check same-losses REL A.jsonl B.jsonl...  every file's loss at every step it holds
//                                                      equals A's at that step within REL
//                                                      relative (0 = bitwise)
//   metrics_check loss-falls RATIO A.jsonl            the last loss is below RATIO x the first
//   metrics_check skipped-at STEP A.jsonl             exactly STEP was skipped, every loss finite
//   metrics_check trace RANKS T.json                  a Chrome trace with compute and collective
//                                                      spans from each of RANKS ranks
// Exit 0 when the check holds, 1 (with the first difference printed) when it does not, 2 on
// unreadable input.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
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
};

Metrics read_metrics(const std::string& path) {
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
    } else if (record["event"] == "step") {
      const auto& loss = record.at("loss");
      m.steps.push_back(record.at("step").get<long>());
      m.losses.push_back(loss.is_null() ? std::nan("") : loss.get<double>());
      m.skipped.push_back(record.value("skipped", false));
      m.loss_scales.push_back(record.value("loss_scale", 1.0));
    }
  }
  if (m.losses.empty()) {
    std::cerr << "metrics_check: " << path << " has no step records\n";
    std::exit(2);
  }
  return m;
}

int same_losses(double rel, const std::vector<std::string>& paths) {
  const Metrics reference = read_metrics(paths[0]);
  int failures = 0;
  for (size_t f = 1; f < paths.size(); ++f) {
    const Metrics other = read_metrics(paths[f]);
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
    if (other.losses.size() < 1) failed = true;
    failures += failed ? 1 : 0;
    std::printf("%s (N=%d, stage %d): %zu steps, worst relative difference %.3g\n",
                paths[f].c_str(), other.world_size, other.stage, other.losses.size(), worst);
  }
  return failures == 0 ? 0 : 1;
}

int loss_falls(double ratio, const std::string& path) {
  const Metrics m = read_metrics(path);
  const double first = m.losses.front();
  const double last = m.losses.back();
  std::printf("%s: first loss %.6g, last loss %.6g after %zu steps (ratio %.3f, limit %.3f)\n",
              path.c_str(), first, last, m.losses.size(), last / first, ratio);
  return last < ratio * first ? 0 : 1;
}

int skipped_at(long step, const std::string& path) {
  const Metrics m = read_metrics(path);
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

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "same-losses") {
    return same_losses(std::atof(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
  }
  if (argc == 4 && std::string(argv[1]) == "loss-falls") {
    return loss_falls(std::atof(argv[2]), argv[3]);
  }
  if (argc == 4 && std::string(argv[1]) == "skipped-at") {
    return skipped_at(std::atol(argv[2]), argv[3]);
  }
  if (argc == 4 && std::string(argv[1]) == "trace") {
    return trace_has_every_rank(std::atoi(argv[2]), argv[3]);
  }
  std::cerr << "usage: metrics_check same-losses REL A.jsonl B.jsonl...\n"
               "       metrics_check loss-falls RATIO A.jsonl\n"
               "       metrics_check skipped-at STEP A.jsonl\n"
               "       metrics_check trace RANKS T.json\n";
  return 2;
}
