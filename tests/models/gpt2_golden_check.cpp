// Checks a zero-train run of the reference GPT-2 against what PyTorch computed for the same
// weights and batch in float64 (tests/data/gpt2/expected_fp64.json, the exact answer a float32
// run approximates): the loss and the global gradient norm of every step within R relative
// (--reference-tolerance, 1e-5 unless given), and, in the weights exported after the last step,
// every parameter's L2 norm within R relative and its sum within 10 R of its L2 norm (a 16-bit
// run is held to the same reference with a larger R). With --same-as, the exported weights must
// also equal another run's: bit for bit (--tolerance 0) or within a relative tolerance per
// parameter's L2 norm (stage parity across world sizes). With --same-metrics-as, every step's
// loss, gradient norm and validation loss must equal another run's bit for bit, or within
// --metrics-tolerance M relative. With --first-loss-tolerance F, the first step's loss (the
// forward of the initial weights, before any update can amplify rounding) must also be within F
// relative. Without --final the weights are not checked (a run that exports none).
//
// The reference is the float64 run, not PyTorch's float32 one (expected.json), because two
// float32 runs round apart by more than R on one sum: the key third of c_attn.bias has no
// gradient but rounding noise, which Adam scales into updates of ~1e-5, so h.0's c_attn.bias
// sum in PyTorch's float32 run is 0.69 of its tolerance from float64, ours 0.12 (OpenBLAS's
// kernels for this CPU) and 0.40 (OPENBLAS_CORETYPE=Haswell), but ours from PyTorch's float32
// run 0.56 and 1.09. Against float64 every figure of ours is within 0.43 of its tolerance
// (stage 0, 1 rank, both kernels).
//
//   gpt2_golden_check --expected E.json --metrics run.jsonl [--final final.safetensors]
//                     [--reference-tolerance R] [--same-as other.safetensors --tolerance X]
//                     [--expect-val 1] [--same-metrics-as other.jsonl [--metrics-tolerance M]]
//                     [--first-loss-tolerance F]
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero/core/text.h"
#include "zero/runtime/safetensors.h"

namespace {

int failures = 0;

void check_close(const std::string& what, double got, double expected, double tolerance) {
  if (std::fabs(got - expected) <= tolerance) return;
  std::printf("FAIL %s: %.9g, expected %.9g (difference %.3g > %.3g)\n", what.c_str(), got,
              expected, std::fabs(got - expected), tolerance);
  ++failures;
}

std::map<std::string, std::vector<float>> tensors_of(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  for (zero::LoadedTensor& t : zero::load_safetensors(path).tensors) {
    out[t.name] = std::move(t.values);
  }
  return out;
}

std::vector<nlohmann::json> step_records(const std::string& path) {
  std::vector<nlohmann::json> steps;
  std::ifstream metrics(path);
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("event", "") == "step") steps.push_back(record);
  }
  return steps;
}

// The metrics record floats, written with every digit JSON needs: equal text, equal bits. With a
// tolerance above 0, each value within that much of the other's, relative.
void check_same_metrics(const std::vector<nlohmann::json>& steps, const std::string& other_path,
                        double tolerance) {
  const std::vector<nlohmann::json> other = step_records(other_path);
  if (other.size() != steps.size()) {
    std::printf("FAIL the run has %zu steps, the other run %zu\n", steps.size(), other.size());
    ++failures;
    return;
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    for (const char* key : {"loss", "grad_norm", "val_loss"}) {
      const nlohmann::json mine = steps[s].value(key, nlohmann::json());
      const nlohmann::json theirs = other[s].value(key, nlohmann::json());
      if (tolerance > 0.0 && mine.is_number() && theirs.is_number()) {
        const double want = theirs.get<double>();
        check_close("step " + std::to_string(s + 1) + " " + key + " against the other run",
                    mine.get<double>(), want, tolerance * std::fabs(want));
        continue;
      }
      if (mine == theirs) continue;
      std::printf("FAIL step %zu %s: %s, the other run has %s (bitwise)\n", s + 1, key,
                  steps[s].value(key, nlohmann::json()).dump().c_str(),
                  other[s].value(key, nlohmann::json()).dump().c_str());
      ++failures;
    }
  }
}

// The exported weights against PyTorch's final L2 norms and sums, and with --same-as against
// another run's export.
void check_final_weights(const std::map<std::string, std::string>& args,
                         const nlohmann::json& expected, double r) {
  const auto final_weights = tensors_of(args.at("--final"));
  if (final_weights.size() != expected["final_params"].size()) {
    std::printf("FAIL the export has %zu tensors, the reference %zu\n", final_weights.size(),
                expected["final_params"].size());
    ++failures;
  }
  for (const auto& [name, want] : expected["final_params"].items()) {
    auto it = final_weights.find(name);
    if (it == final_weights.end()) {
      std::printf("FAIL %s is not in the export\n", name.c_str());
      ++failures;
      continue;
    }
    double sum = 0.0, squares = 0.0;
    for (float v : it->second) {
      sum += v;
      squares += static_cast<double>(v) * v;
    }
    const double l2 = want["l2"];
    check_close(name + " L2", std::sqrt(squares), l2, r * l2);
    check_close(name + " sum", sum, want["sum"].get<double>(), 10 * r * l2);
  }

  if (args.count("--same-as")) {
    const double tolerance = std::stod(args.at("--tolerance"));
    const auto other = tensors_of(args.at("--same-as"));
    for (const auto& [name, values] : final_weights) {
      const std::vector<float>& theirs = other.at(name);
      double diff = 0.0, norm = 0.0;
      for (size_t i = 0; i < values.size(); ++i) {
        // The key third of c_attn.bias has a zero gradient in exact arithmetic (adding b to
        // every key adds q.b to every score of a row, which the softmax ignores), so what it
        // gets is rounding noise, of the order of the summation, which Adam divides by eps
        // into updates of ~1e-5. Measured on 3 ranks: 1.1e-6 apart between stages where every
        // other tensor is within 7e-8 relative. It is still checked against PyTorch above.
        const size_t third = values.size() / 3;
        if (tolerance > 0.0 && zero::ends_with(name, "attn.c_attn.bias") && i >= third &&
            i < 2 * third) {
          continue;
        }
        if (tolerance == 0.0 && values[i] != theirs[i]) {
          std::printf("FAIL %s[%zu] = %.9g, the other run has %.9g (bitwise)\n", name.c_str(), i,
                      values[i], theirs[i]);
          ++failures;
          break;
        }
        diff += (static_cast<double>(values[i]) - theirs[i]) *
                (static_cast<double>(values[i]) - theirs[i]);
        norm += static_cast<double>(theirs[i]) * theirs[i];
      }
      check_close(name + " against the other run", std::sqrt(diff), 0.0,
                  tolerance * std::sqrt(norm));
    }
  }
}

int check(const std::map<std::string, std::string>& args) {
  std::ifstream expected_file(args.at("--expected"));
  const nlohmann::json expected = nlohmann::json::parse(expected_file);

  const std::vector<nlohmann::json> steps = step_records(args.at("--metrics"));
  if (steps.size() != expected["steps"].size()) {
    std::printf("FAIL the run has %zu steps, the reference %zu\n", steps.size(),
                expected["steps"].size());
    return 1;
  }
  const double r =
      args.count("--reference-tolerance") ? std::stod(args.at("--reference-tolerance")) : 1e-5;
  for (size_t s = 0; s < steps.size(); ++s) {
    const nlohmann::json& want = expected["steps"][s];
    const std::string step = "step " + std::to_string(s + 1);
    const double loss = want["loss"], norm = want["grad_norm"];
    check_close(step + " loss", steps[s]["loss"].get<double>(), loss, r * loss);
    check_close(step + " grad_norm", steps[s]["grad_norm"].get<double>(), norm, r * norm);
    // --expect-val: the run validated on the training batch after every step, so its val_loss
    // after step s is the reference's loss before step s + 1 (the same batch, updated weights).
    if (args.count("--expect-val") && s + 1 < steps.size()) {
      if (!steps[s].contains("val_loss")) {
        std::printf("FAIL %s has no val_loss\n", step.c_str());
        ++failures;
        continue;
      }
      const double next = expected["steps"][s + 1]["loss"];
      check_close(step + " val_loss", steps[s]["val_loss"].get<double>(), next, r * next);
    }
  }

  if (args.count("--first-loss-tolerance") && !steps.empty()) {
    const double first = expected["steps"][0]["loss"];
    check_close("step 1 loss (first-loss tolerance)", steps[0]["loss"].get<double>(), first,
                std::stod(args.at("--first-loss-tolerance")) * first);
  }
  if (args.count("--same-metrics-as")) {
    check_same_metrics(
        steps, args.at("--same-metrics-as"),
        args.count("--metrics-tolerance") ? std::stod(args.at("--metrics-tolerance")) : 0.0);
  }
  if (args.count("--final")) check_final_weights(args, expected, r);
  std::printf("%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  for (const char* required : {"--expected", "--metrics"}) {
    if (!args.count(required)) {
      std::fprintf(stderr, "gpt2_golden_check: %s is required\n", required);
      return 2;
    }
  }
  if (args.count("--same-as") != args.count("--tolerance")) {
    std::fprintf(stderr, "gpt2_golden_check: --same-as and --tolerance go together\n");
    return 2;
  }
  try {
    return check(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2_golden_check: %s\n", e.what());
    return 1;
  }
}
