#include "examples/flops_profile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "zero/core/check.h"

namespace zero::examples {

namespace {

// DeepSpeed's number_to_string: "1.23 G".
std::string scaled(double v, const char* unit) {
  static const std::pair<double, const char*> kScales[] = {
      {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
  char text[64];
  for (const auto& [scale, prefix] : kScales) {
    if (v >= scale) {
      std::snprintf(text, sizeof(text), "%.2f %s%s", v / scale, prefix, unit);
      return text;
    }
  }
  std::snprintf(text, sizeof(text), "%.2f %s", v, unit);
  return text;
}

std::string percent(double part, double whole) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return text;
}

std::string module_label(const FlopsProfile& profile, size_t k) {
  const std::string& name = profile.modules[k].name;
  return name.empty() ? "(module " + std::to_string(k) + ")" : name;
}

}  // namespace

double FlopsProfile::total_flops() const {
  double total = 0;
  for (const ModuleProfile& m : modules) total += m.forward_flops + m.backward_flops;
  return total;
}

FlopsProfile profile_step(const Layout& layout, const driver::JsonRecord& model_record,
                          const std::vector<TraceSpan>& spans, long step, double step_ms,
                          double tokens, const std::vector<std::string>& counted_elsewhere) {
  FlopsProfile profile;
  profile.step = step;
  profile.step_ms = step_ms;
  profile.tokens = tokens;
  profile.modules.resize(static_cast<size_t>(layout.num_modules()));
  // Modules run forward in their order: the k-th name forward spans give is module k's.
  std::map<std::string, size_t> index;
  for (const TraceSpan& span : spans) {
    if (span.comm || span.name.rfind("forward ", 0) != 0) continue;
    const std::string name = span.name.substr(8);
    if (index.count(name) == 0 && index.size() < profile.modules.size()) {
      const size_t k = index.size();
      index[name] = k;
      profile.modules[k].name = name;
    }
  }
  for (const TraceSpan& span : spans) {
    if (span.comm) continue;
    const bool forward = span.name.rfind("forward ", 0) == 0;
    const bool backward = span.name.rfind("backward ", 0) == 0;
    if (!forward && !backward) continue;
    const auto it = index.find(span.name.substr(forward ? 8 : 9));
    if (it == index.end()) continue;
    (forward ? profile.modules[it->second].forward_ms : profile.modules[it->second].backward_ms) +=
        (span.end_us - span.begin_us) / 1000.0;
  }
  for (const ParamPlacement& p : layout.params()) {
    if (std::find(counted_elsewhere.begin(), counted_elsewhere.end(), p.name) !=
        counted_elsewhere.end()) {
      continue;
    }
    profile.modules[static_cast<size_t>(p.module)].params += p.numel;
  }
  // The GPT-2's blocks (h.N) add their attention: 12 * n_layer * n_embd * seq_len per token over
  // forward and backward, a third of it forward.
  const double attention =
      model_record.contains("n_embd") && model_record.contains("seq_len")
          ? 4.0 * model_record["n_embd"].get<double>() * model_record["seq_len"].get<double>()
          : 0.0;
  for (ModuleProfile& m : profile.modules) {
    const bool block = m.name.rfind("h.", 0) == 0;
    m.forward_flops = tokens * (2.0 * static_cast<double>(m.params) + (block ? attention : 0.0));
    m.backward_flops = 2.0 * m.forward_flops;
  }
  return profile;
}

std::string flops_profile_text(const FlopsProfile& p, const FlopsProfilerConfig& config) {
  uint64_t params = 0;
  double forward = 0, forward_ms = 0, backward_ms = 0;
  for (const ModuleProfile& m : p.modules) {
    params += m.params;
    forward += m.forward_flops;
    forward_ms += m.forward_ms;
    backward_ms += m.backward_ms;
  }
  const double total = p.total_flops();
  char line[256];
  std::string out =
      "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n"
      "Profile Summary at step " +
      std::to_string(p.step) + ":\n";
  const auto row = [&](const char* key, const std::string& value) {
    std::snprintf(line, sizeof(line), "%-62s%s\n", key, value.c_str());
    out += line;
  };
  row("params of the model:", scaled(static_cast<double>(params), ""));
  row("tokens in the step (all ranks):", scaled(p.tokens, ""));
  row("fwd flops of the step:", scaled(forward, ""));
  row("bwd flops of the step:", scaled(total - forward, ""));
  row("fwd+bwd flops of the step:", scaled(total, ""));
  row(("fwd latency (" + p.latency_of + "):").c_str(), scaled(forward_ms, "ms"));
  row(("bwd latency (" + p.latency_of + "):").c_str(), scaled(backward_ms, "ms"));
  row("step latency (rank 0):", scaled(p.step_ms, "ms"));
  row("fwd+bwd FLOPS of the step:", scaled(total / (p.step_ms / 1000.0), "FLOPS"));
  if (config.module_depth == 0) return out;

  out += "\n----------------------------- Aggregated Profile -----------------------------\n";
  out += "Top " + std::to_string(config.top_modules) +
         " modules in terms of params, flops or fwd latency at depth 1:\n";
  const auto top = [&](const char* what, auto key, auto text) {
    std::vector<const ModuleProfile*> sorted;
    for (const ModuleProfile& m : p.modules) sorted.push_back(&m);
    std::stable_sort(
        sorted.begin(), sorted.end(),
        [&](const ModuleProfile* a, const ModuleProfile* b) { return key(*a) > key(*b); });
    out += std::string("    ") + what + " - {";
    for (size_t k = 0; k < sorted.size() && k < static_cast<size_t>(config.top_modules); ++k) {
      const size_t place = static_cast<size_t>(sorted[k] - p.modules.data());
      out += (k ? ", '" : "'") + module_label(p, place) + "': '" + text(key(*sorted[k])) + "'";
    }
    out += "}\n";
  };
  top(
      "params     ", [](const ModuleProfile& m) { return static_cast<double>(m.params); },
      [](double v) { return scaled(v, ""); });
  top(
      "flops      ", [](const ModuleProfile& m) { return m.forward_flops + m.backward_flops; },
      [](double v) { return scaled(v, ""); });
  top(
      "fwd latency", [](const ModuleProfile& m) { return m.forward_ms; },
      [](double v) { return scaled(v, "ms"); });
  if (!config.detailed) return out;

  out +=
      "\n------------------------------ Detailed Profile ------------------------------\n"
      "Each module: params, share of params, fwd flops, bwd flops, share of flops, fwd latency, "
      "bwd latency, share of the step's latency\n";
  for (size_t k = 0; k < p.modules.size(); ++k) {
    const ModuleProfile& m = p.modules[k];
    out += "  " + module_label(p, k) + ": " + scaled(static_cast<double>(m.params), "") + ", " +
           percent(static_cast<double>(m.params), static_cast<double>(params)) + ", " +
           scaled(m.forward_flops, "") + ", " + scaled(m.backward_flops, "") + ", " +
           percent(m.forward_flops + m.backward_flops, total) + ", " + scaled(m.forward_ms, "ms") +
           ", " + scaled(m.backward_ms, "ms") + ", " +
           percent(m.forward_ms + m.backward_ms, p.step_ms) + "\n";
  }
  return out;
}

driver::JsonRecord module_profiles_record(const std::vector<ModuleProfile>& modules) {
  driver::JsonRecord record = driver::JsonRecord::array();
  for (const ModuleProfile& m : modules) {
    record.push_back({{"name", m.name},
                      {"params", m.params},
                      {"forward_flops", m.forward_flops},
                      {"backward_flops", m.backward_flops},
                      {"forward_ms", m.forward_ms},
                      {"backward_ms", m.backward_ms}});
  }
  return record;
}

std::vector<ModuleProfile> module_profiles_from_record(const driver::JsonRecord& record) {
  std::vector<ModuleProfile> modules;
  for (const driver::JsonRecord& m : record) {
    modules.push_back({m.at("name").get<std::string>(), m.at("params").get<uint64_t>(),
                       m.at("forward_flops").get<double>(), m.at("backward_flops").get<double>(),
                       m.at("forward_ms").get<double>(), m.at("backward_ms").get<double>()});
  }
  return modules;
}

driver::JsonRecord flops_profile_record(const FlopsProfile& p) {
  driver::JsonRecord modules = module_profiles_record(p.modules);
  for (size_t k = 0; k < p.modules.size(); ++k) modules[k]["name"] = module_label(p, k);
  return {{"event", "flops_profile"},       {"step", p.step},       {"tokens", p.tokens},
          {"total_flops", p.total_flops()}, {"step_ms", p.step_ms}, {"modules", modules}};
}

void report_flops_profile(const FlopsProfile& profile, const FlopsProfilerConfig& config,
                          driver::MetricsWriter* metrics) {
  const std::string text = flops_profile_text(profile, config);
  if (config.output_file.empty()) {
    std::printf("%s", text.c_str());
    std::fflush(stdout);
  } else {
    std::ofstream out(config.output_file, std::ios::trunc);
    out << text;
    out.close();
    ZERO_CHECK(out, "cannot write flops_profiler.output_file '" << config.output_file
                                                                << "': " << std::strerror(errno));
  }
  metrics->write(flops_profile_record(profile));
}

}  // namespace zero::examples
