#include "zero/runtime/weights.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "zero/core/check.h"
#include "zero/core/text.h"

namespace zero {

void import_weights(Engine& engine, const std::vector<LoadedTensor>& tensors,
                    const std::string& source) {
  const Layout& layout = engine.layout();
  std::map<std::string, const LoadedTensor*> by_name;
  for (const LoadedTensor& t : tensors) {
    ZERO_CHECK(by_name.emplace(t.name, &t).second,
               source << ": tensor '" << t.name << "' appears twice");
  }
  for (const ParamPlacement& p : layout.params()) {
    auto it = by_name.find(p.name);
    ZERO_CHECK(it != by_name.end(), source << ": the model's parameter '" << p.name << "' "
                                           << shape_text(p.shape) << " is missing");
    ZERO_CHECK(it->second->shape == p.shape,
               source << ": tensor '" << p.name << "' has shape " << shape_text(it->second->shape)
                      << " but the model's parameter is " << shape_text(p.shape));
  }
  // A NaN or infinity would surface only as a gradient overflow at step 1: refused here.
  for (const LoadedTensor& t : tensors) {
    const auto bad =
        std::find_if(t.values.begin(), t.values.end(), [](float v) { return !std::isfinite(v); });
    ZERO_CHECK(bad == t.values.end(), source << ": tensor '" << t.name << "' holds " << *bad
                                             << " at index " << (bad - t.values.begin())
                                             << ": the weights must be finite");
  }
  for (const LoadedTensor& t : tensors) {
    const bool known = std::any_of(layout.params().begin(), layout.params().end(),
                                   [&](const ParamPlacement& p) { return p.name == t.name; });
    ZERO_CHECK(known, source << ": tensor '" << t.name << "' " << shape_text(t.shape)
                             << " is not a parameter of the model");
  }
  // Each rank writes the part of every parameter that falls in the slice of each unit it holds,
  // a unit at a time.
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Engine::StateView view = engine.state_view(static_cast<int>(u));
    for (int index : layout.units()[u].params) {
      const ParamPlacement& p = layout.params()[index];
      const std::vector<float>& values = by_name.at(p.name)->values;
      const size_t begin = std::max(view.begin, p.offset);
      const size_t end = std::min(view.end, p.offset + p.numel);
      for (size_t i = begin; i < end; ++i) view.master[i - view.begin] = values[i - p.offset];
    }
    engine.write_state_views();
  }
  engine.state_loaded();
}

}  // namespace zero
