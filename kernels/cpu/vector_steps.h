// How the vector paths step over a range, shared by the loops written once over an ISA's traits
// (kernel_loops.h, transformer_rows.h). Included by translation units compiled with different
// ISA flags, so everything here is a template in an anonymous namespace: each file's
// instantiations are its own, and the linker can never keep one file's copy for another's calls.
#pragma once

#include <cstddef>

namespace zero::kernels::detail {
namespace {

// The lanes argument of a whole vector step: the traits' loads and stores take it, or their
// mask type for a partial last step, and compile each to its plain or masked form.
struct AllLanes {};

// Runs step(i, lanes) over [begin, end): whole vectors of V::kWidth elements with AllLanes{},
// then, on a path whose traits mask (V::kMaskedTail), one partial step with the mask
// V::tail_lanes(i, end). Returns where it stopped: end, or the first element of the tail the
// path leaves to the scalar loops.
template <typename V, typename Step>
size_t vector_steps(size_t begin, size_t end, Step&& step) {
  size_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) step(i, AllLanes{});
  if constexpr (V::kMaskedTail) {
    if (i < end) step(i, V::tail_lanes(i, end));
    return end;
  } else {
    return i;
  }
}

}  // namespace
}  // namespace zero::kernels::detail
