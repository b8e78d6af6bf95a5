// The CUDA element kernels' per-thread bodies (cuda_kernel_bodies.h), run by g++ over their whole
// grid in loops: every block, every thread, every launch of a multi-tensor plan. Checks the
// indexing, the tails, the aligned and unaligned paths and the chunk tables against the scalar
// reference of dtype.h / optimizer_math.h, bit for bit. Needs no GPU and no nvcc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernel_bodies.h"
#include "tests/kernels/cuda_grid_util.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels::cuda {
namespace {

// --- cast ---------------------------------------------------------------------------------------

template <DType S, DType D>
void check_cast_grid() {
  std::mt19937 rng(11);
  for (size_t misalign : {0, 1}) {
    for (size_t n : kSizes) {
      GuardedBuffer src(n * dtype_size(S), misalign * dtype_size(S));
      GuardedBuffer dst(n * dtype_size(D), 0);
      fill_random(src.data(), S, n, rng, -70000.0f, 70000.0f);  // past fp16's range too
      std::vector<uint8_t> want(n * dtype_size(D));
      for (size_t i = 0; i < n; ++i)
        store_from_float(want.data(), D, i, load_as_float(src.data(), S, i));
      run_element_grid(n, "cast", [&](uint32_t b, uint32_t t) {
        cast_thread<S, D>(b, t, src.data(), dst.data(), n);
      });
      EXPECT_EQ(bytes_of(dst.data(), want.size()), want) << "n " << n << " misalign " << misalign;
      EXPECT_TRUE(dst.guards_intact() && src.guards_intact());
    }
  }
}

TEST(CudaGridCast, AllDtypePairsMatchScalarReference) {
  check_cast_grid<DType::kFloat32, DType::kBFloat16>();
  check_cast_grid<DType::kFloat32, DType::kFloat16>();
  check_cast_grid<DType::kBFloat16, DType::kFloat32>();
  check_cast_grid<DType::kFloat16, DType::kFloat32>();
  check_cast_grid<DType::kBFloat16, DType::kFloat16>();
  check_cast_grid<DType::kFloat16, DType::kBFloat16>();
}

// --- add and scale ------------------------------------------------------------------------------

// The CPU's result for dst += src: kernels::accumulate for equal dtypes, else the one rounding of
// ParamRef::add_f32 (store_from_float of the fp32 sum) that the CPU path uses for mixed dtypes.
template <DType D, DType S>
std::vector<uint8_t> cpu_add(const void* dst, const void* src, size_t n) {
  std::vector<uint8_t> out = bytes_of(dst, n * dtype_size(D));
  if (n == 0) return out;
  if constexpr (D == S) {
    kernels::accumulate(out.data(), src, D, n);
  } else {
    for (size_t i = 0; i < n; ++i) {
      store_from_float(out.data(), D, i,
                       load_as_float(out.data(), D, i) + load_as_float(src, S, i));
    }
  }
  return out;
}

template <DType D, DType S>
void check_add_grid() {
  std::mt19937 rng(17 + static_cast<unsigned>(D) * 3 + static_cast<unsigned>(S));
  // Each pointer misaligned on its own sends the whole tensor down the element-at-a-time path.
  for (size_t dst_misalign : {0, 1}) {
    for (size_t src_misalign : {0, 1}) {
      for (size_t n : kSizes) {
        GuardedBuffer dst(n * dtype_size(D), dst_misalign * dtype_size(D));
        GuardedBuffer src(n * dtype_size(S), src_misalign * dtype_size(S));
        // Sums past 65504 overflow fp16: both sides must round them to infinity alike.
        fill_random(dst.data(), D, n, rng, -40000.0f, 40000.0f);
        fill_random(src.data(), S, n, rng, -40000.0f, 40000.0f);
        const std::vector<uint8_t> want = cpu_add<D, S>(dst.data(), src.data(), n);
        run_element_grid(n, "add", [&](uint32_t b, uint32_t t) {
          add_thread<D, S>(b, t, dst.data(), src.data(), n);
        });
        EXPECT_EQ(bytes_of(dst.data(), want.size()), want)
            << dtype_name(S) << " into " << dtype_name(D) << ", n " << n << " misalign "
            << dst_misalign << "/" << src_misalign;
        EXPECT_TRUE(dst.guards_intact() && src.guards_intact());
      }
    }
  }
}

template <DType D>
void check_add_grid_all_sources() {
  check_add_grid<D, DType::kFloat32>();
  check_add_grid<D, DType::kBFloat16>();
  check_add_grid<D, DType::kFloat16>();
}

TEST(CudaGridAdd, IntoFp32MatchesCpuForEverySourceDtype) {
  check_add_grid_all_sources<DType::kFloat32>();
}
TEST(CudaGridAdd, IntoBf16MatchesCpuForEverySourceDtype) {
  check_add_grid_all_sources<DType::kBFloat16>();
}
TEST(CudaGridAdd, IntoFp16MatchesCpuForEverySourceDtype) {
  check_add_grid_all_sources<DType::kFloat16>();
}

TEST(CudaGridAdd, SourceMayBeTheDestination) {
  const size_t n = 8197;
  std::vector<uint16_t> x(n);
  std::mt19937 rng(19);
  fill_random(x.data(), DType::kBFloat16, n, rng, -5.0f, 5.0f);
  std::vector<uint16_t> want = x;
  for (size_t i = 0; i < n; ++i) want[i] = float_to_bf16(bf16_to_float(x[i]) * 2.0f);
  run_element_grid(n, "add", [&](uint32_t b, uint32_t t) {
    add_thread<DType::kBFloat16, DType::kBFloat16>(b, t, x.data(), x.data(), n);
  });
  EXPECT_EQ(x, want);
}

template <DType D>
void check_scale_grid() {
  std::mt19937 rng(23 + static_cast<unsigned>(D));
  for (float alpha : {0.37f, 3.0f, -1.0f / 3.0f}) {
    for (size_t misalign : {0, 1}) {
      for (size_t n : kSizes) {
        GuardedBuffer x(n * dtype_size(D), misalign * dtype_size(D));
        // 3 * 30000 overflows fp16; tiny values meet its subnormals.
        fill_random(x.data(), D, n, rng, -30000.0f, 30000.0f);
        if (n > 2) store_from_float(x.data(), D, 2, 1e-6f);
        std::vector<uint8_t> want = bytes_of(x.data(), n * dtype_size(D));
        if (n > 0) kernels::scale(want.data(), D, alpha, n);
        run_element_grid(
            n, "scale", [&](uint32_t b, uint32_t t) { scale_thread<D>(b, t, x.data(), alpha, n); });
        EXPECT_EQ(bytes_of(x.data(), want.size()), want)
            << dtype_name(D) << " alpha " << alpha << ", n " << n << " misalign " << misalign;
        EXPECT_TRUE(x.guards_intact());
      }
    }
  }
}

TEST(CudaGridScale, EveryDtypeMatchesTheCpuKernel) {
  check_scale_grid<DType::kFloat32>();
  check_scale_grid<DType::kBFloat16>();
  check_scale_grid<DType::kFloat16>();
}

// --- flatten / unflatten
// --------------------------------------------------------------------------

TEST(CudaGridCopy, FlattenAndUnflattenManyTensorsWithGapsAndTails) {
  for (DType dtype : kDTypes) {
    const size_t elem = dtype_size(dtype);
    std::mt19937 rng(5);
    // 70 tensors: two launches. Offsets leave gaps, some of them unaligned to 16 bytes.
    std::vector<std::unique_ptr<GuardedBuffer>> tensors;
    std::vector<TensorSlot> slots;
    size_t offset = 0;
    for (size_t i = 0; i < 70; ++i) {
      const size_t n = kSizes[i % kSizes.size()] + (i / kSizes.size());
      const size_t misalign = i % 3 == 2 ? elem : 0;
      tensors.push_back(std::make_unique<GuardedBuffer>(n * elem, misalign));
      fill_random(tensors.back()->data(), dtype, n, rng, -1.0f, 1.0f);
      offset += i % 4;  // gap of 0-3 elements before the tensor
      slots.push_back({tensors.back()->data(), offset, n});
      offset += n;
    }
    GuardedBuffer flat(offset * elem, 0);
    std::memset(flat.data(), 0x5A, offset * elem);
    const CopyArgs<true> to_flat{flat.data(), static_cast<uint32_t>(elem)};
    const auto plans = plan_launches(slots.data(), slots.size(), kChunkBytes,
                                     [elem](const TensorSlot& s) { return slot_bytes(s, elem); });
    EXPECT_EQ(plans.size(), 2u);
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<TensorSlot>& table) {
      copy_slots_thread<true>(b, t, table, to_flat);
    });
    std::vector<uint8_t> want(offset * elem, 0x5A);
    for (const TensorSlot& s : slots)
      std::memcpy(want.data() + s.offset * elem, s.data, s.numel * elem);
    EXPECT_EQ(bytes_of(flat.data(), want.size()), want) << dtype_name(dtype);
    EXPECT_TRUE(flat.guards_intact());

    // Back out into poisoned tensors: each gets exactly its slice.
    std::vector<std::vector<uint8_t>> originals;
    for (const TensorSlot& s : slots) {
      originals.push_back(bytes_of(s.data, s.numel * elem));
      std::memset(s.data, 0xEE, s.numel * elem);
    }
    const CopyArgs<false> from_flat{flat.data(), static_cast<uint32_t>(elem)};
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<TensorSlot>& table) {
      copy_slots_thread<false>(b, t, table, from_flat);
    });
    for (size_t i = 0; i < slots.size(); ++i) {
      EXPECT_EQ(bytes_of(slots[i].data, slots[i].numel * elem), originals[i]) << "tensor " << i;
      EXPECT_TRUE(tensors[i]->guards_intact());
    }
  }
}

// --- finite check -------------------------------------------------------------------------------

template <DType D>
void check_finite_grid() {
  const std::vector<size_t> sizes = {1, 5, 8192, 8197, 20000};
  std::vector<std::vector<uint8_t>> storage;
  std::vector<ConstTensor> tensors;
  std::mt19937 rng(9);
  for (size_t n : sizes) {
    storage.emplace_back(n * dtype_size(D) + dtype_size(D));
    // The second half of the tensors starts one element in: unaligned.
    uint8_t* data = storage.back().data() + (tensors.size() % 2) * dtype_size(D);
    fill_random(data, D, n, rng, -60000.0f, 60000.0f);
    tensors.push_back({data, n});
  }
  const auto plans = plan_launches(tensors.data(), tensors.size(), kChunkElements,
                                   [](const ConstTensor& t) { return t.numel; });
  auto run = [&](int initial) {
    int flag = initial;
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<ConstTensor>& table) {
      check_finite_thread<D>(b, t, table, &flag);
    });
    return flag;
  };
  EXPECT_EQ(run(0), 0);
  EXPECT_EQ(run(1), 1);  // the flag is only ever set, never cleared
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const size_t n = tensors[ti].numel;
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      void* data = const_cast<void*>(tensors[ti].data);
      const float saved = load_as_float(data, D, pos);
      for (float value : bad) {
        store_from_float(data, D, pos, value);
        EXPECT_EQ(run(0), 1) << "tensor " << ti << " position " << pos << " value " << value;
      }
      store_from_float(data, D, pos, saved);
    }
  }
  EXPECT_EQ(run(0), 0);
}

TEST(CudaGridFinite, FindsNanAndInfinityInEveryTensorAndPosition) {
  check_finite_grid<DType::kFloat32>();
  check_finite_grid<DType::kBFloat16>();
  check_finite_grid<DType::kFloat16>();
}

// --- sum of squares
// --------------------------------------------------------------------------------

// Both stages as the .cu runs them: per block, kBlockThreads partials added by the tree, one
// double per block; then one block adds those with the same tree and rounds to float.
template <DType D>
float grid_sum_squares(const std::vector<ConstTensor>& tensors, int* flag) {
  const auto plans = plan_launches(tensors.data(), tensors.size(), kChunkElements,
                                   [](const ConstTensor& t) { return t.numel; });
  std::vector<double> partials;
  double shared[kBlockThreads];
  auto tree = [&] {
    for (uint32_t half = kBlockThreads / 2; half > 0; half /= 2) {
      for (uint32_t t = 0; t < kBlockThreads; ++t) tree_sum_level(shared, t, half);
    }
    return shared[0];
  };
  for (const auto& table : plans) {
    for (uint32_t b = 0; b < table.blocks(); ++b) {
      for (uint32_t t = 0; t < kBlockThreads; ++t) shared[t] = sum_squares_thread<D>(b, t, table);
      partials.push_back(tree());
    }
  }
  for (uint32_t t = 0; t < kBlockThreads; ++t) {
    shared[t] = sum_partials_thread(t, partials.data(), partials.size());
  }
  float out = -1.0f;
  finish_sum_squares(tree(), &out, flag);
  return out;
}

TEST(CudaGridSumSquares, SmallIntegersGiveTheExactSum) {
  // Squares of small integers add exactly in double in any order, so any element counted twice
  // or missed changes the result.
  for (DType dtype : kDTypes) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<ConstTensor> tensors;
    double exact = 0.0;
    for (size_t i = 0; i < 80; ++i) {  // two launches
      const size_t n = kSizes[i % kSizes.size()];
      storage.emplace_back((n + 1) * dtype_size(dtype));
      uint8_t* data = storage.back().data() + (i % 2) * dtype_size(dtype);
      for (size_t j = 0; j < n; ++j) {
        const float x = static_cast<float>(static_cast<int>((i * 31 + j * 7) % 9) - 4);
        store_from_float(data, dtype, j, x);
        exact += static_cast<double>(x) * x;
      }
      tensors.push_back({data, n});
    }
    int flag = 0;
    const float got = [&] {
      switch (dtype) {
        case DType::kFloat32:
          return grid_sum_squares<DType::kFloat32>(tensors, &flag);
        case DType::kBFloat16:
          return grid_sum_squares<DType::kBFloat16>(tensors, &flag);
        case DType::kFloat16:
          return grid_sum_squares<DType::kFloat16>(tensors, &flag);
      }
      return 0.0f;
    }();
    EXPECT_EQ(got, static_cast<float>(exact)) << dtype_name(dtype);
    EXPECT_EQ(flag, 0);
  }
}

TEST(CudaGridSumSquares, RandomValuesAgreeWithTheCpuKernelAndFlagNonFinite) {
  std::mt19937 rng(13);
  std::vector<float> a(100003), b(8192), c(7);
  fill_random(a.data(), DType::kFloat32, a.size(), rng, -3.0f, 3.0f);
  fill_random(b.data(), DType::kFloat32, b.size(), rng, -1e3f, 1e3f);
  fill_random(c.data(), DType::kFloat32, c.size(), rng, -1.0f, 1.0f);
  const std::vector<ConstTensor> tensors = {
      {a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  const double cpu = kernels::sum_squares(a.data(), DType::kFloat32, a.size()) +
                     kernels::sum_squares(b.data(), DType::kFloat32, b.size()) +
                     kernels::sum_squares(c.data(), DType::kFloat32, c.size());
  int flag = 0;
  EXPECT_EQ(grid_sum_squares<DType::kFloat32>(tensors, &flag), static_cast<float>(cpu));
  EXPECT_EQ(flag, 0);
  EXPECT_EQ(grid_sum_squares<DType::kFloat32>({}, &flag), 0.0f);  // empty: one stage-2 launch

  b[4096] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(grid_sum_squares<DType::kFloat32>(tensors, &flag)));
  EXPECT_EQ(flag, 1);
  // Finite elements whose squares sum past FLT_MAX overflow the float that travels: flagged.
  b[4096] = 3e19f;
  b[4097] = 3e19f;
  flag = 0;
  EXPECT_TRUE(std::isinf(grid_sum_squares<DType::kFloat32>(tensors, &flag)));
  EXPECT_EQ(flag, 1);
}

}  // namespace
}  // namespace zero::kernels::cuda
