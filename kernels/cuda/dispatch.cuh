// Run-time dtype to template argument, for the launch code of the kernels in this folder:
// with_dtype(d, [&](auto tag) { kernel<decltype(tag)::value><<<...>>>(...); }).
#pragma once

#include <type_traits>

#include "zero/core/check.h"
#include "zero/core/dtype.h"

namespace zero::kernels::cuda {

template <DType D>
using DTypeTag = std::integral_constant<DType, D>;

template <typename F>
void with_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(DTypeTag<DType::kFloat32>{});
      return;
    case DType::kBFloat16:
      f(DTypeTag<DType::kBFloat16>{});
      return;
    case DType::kFloat16:
      f(DTypeTag<DType::kFloat16>{});
      return;
  }
  ZERO_FAIL("unknown dtype " << static_cast<int>(dtype));
}

}  // namespace zero::kernels::cuda
