// The typed accumulate against the scalar definition: fp32 exactly as the fp32 kernel, 16-bit
// sums computed in fp32 and rounded once; sum_in_order's order; copy_to_all's copies.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels {
namespace {

using testing::kAllPaths;
using testing::Path;
using testing::path_name;
using testing::use_path;

TEST(TypedAccumulate, SixteenBitSumsRoundOnce) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{70001}}) {
      std::vector<uint16_t> dst(n), src(n), expected(n);
      for (size_t i = 0; i < n; ++i) {
        store_from_float(dst.data(), dtype, i, 0.37f * static_cast<float>(i % 101) - 9.0f);
        store_from_float(src.data(), dtype, i, 1.0f / static_cast<float>(1 + i % 13));
        store_from_float(expected.data(), dtype, i,
                         load_as_float(dst.data(), dtype, i) + load_as_float(src.data(), dtype, i));
      }
      accumulate(dst.data(), src.data(), dtype, n, KernelOptions{2});
      EXPECT_EQ(dst, expected) << dtype_name(dtype) << " n=" << n;
    }
  }
}

// A 16-bit gradient plus a module's fp32 one, and the reverse (fp32 accumulation of 16-bit
// micro-batch gradients): every vector path's sums are the scalar definition's, odd sizes and
// misaligned pointers included.
TEST(TypedAccumulate, MixedDtypesAddInFp32AndRoundOnce) {
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  for (Path path : kAllPaths) {
    if (!use_path(path)) continue;
    for (DType dst_dtype : dtypes) {
      for (DType src_dtype : dtypes) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{70001}}) {
          for (size_t misalign : {size_t{0}, size_t{1}}) {
            const size_t d = dtype_size(dst_dtype), e = dtype_size(src_dtype);
            std::vector<unsigned char> dst_bytes((n + 1) * d), src_bytes((n + 1) * e);
            void* dst = dst_bytes.data() + misalign * d;
            void* src = src_bytes.data() + misalign * e;
            for (size_t i = 0; i < n; ++i) {
              store_from_float(dst, dst_dtype, i, 0.37f * static_cast<float>(i % 101) - 9.0f);
              store_from_float(src, src_dtype, i, 1.0f / static_cast<float>(1 + i % 13) - 0.02f);
            }
            std::vector<unsigned char> expected = dst_bytes;
            void* want = expected.data() + misalign * d;
            for (size_t i = 0; i < n; ++i) {
              store_from_float(
                  want, dst_dtype, i,
                  load_as_float(want, dst_dtype, i) + load_as_float(src, src_dtype, i));
            }
            accumulate(dst, dst_dtype, src, src_dtype, n, KernelOptions{2});
            EXPECT_EQ(dst_bytes, expected)
                << dtype_name(dst_dtype) << " += " << dtype_name(src_dtype) << " n=" << n
                << " misaligned " << misalign << " path=" << path_name(path);
          }
        }
      }
    }
  }
  reset_kernel_isa_for_testing();
}

TEST(TypedAccumulate, Fp32MatchesTheFp32Kernel) {
  std::vector<float> a(1001), b(1001);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.1f * static_cast<float>(i);
    b[i] = 3.0f - 0.01f * static_cast<float>(i);
  }
  std::vector<float> typed = a;
  accumulate(a.data(), b.data(), a.size());
  accumulate(typed.data(), b.data(), DType::kFloat32, typed.size());
  EXPECT_EQ(a, typed);
}

// Values whose fp32 sums depend on the order of the additions (1e8 + 1 - 1e8 is 0 left to
// right, 1 in any order that cancels first), so a kernel adding in another order fails.
float order_sensitive_value(size_t source, size_t i) {
  const float big = 1e8f * static_cast<float>(1 + i % 3);
  switch (source % 3) {
    case 0:
      return big;
    case 1:
      return 0.37f * static_cast<float>(i % 101) - 9.0f;
    default:
      return -big;
  }
}

TEST(SumInOrder, AddsSourcesLeftToRightInFp32AndRoundsOnce) {
  for (Path path : kAllPaths) {
    if (!use_path(path)) continue;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const size_t elem = dtype_size(dtype);
      for (size_t sources : {size_t{1}, size_t{2}, size_t{3}, size_t{4}}) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{70001}}) {
          std::vector<std::vector<unsigned char>> src(sources,
                                                      std::vector<unsigned char>(n * elem));
          std::vector<const void*> pointers;
          for (size_t k = 0; k < sources; ++k) {
            for (size_t i = 0; i < n; ++i) {
              store_from_float(src[k].data(), dtype, i, order_sensitive_value(k, i));
            }
            pointers.push_back(src[k].data());
          }
          std::vector<unsigned char> expected(n * elem);
          for (size_t i = 0; i < n; ++i) {
            float sum = load_as_float(src[0].data(), dtype, i);
            for (size_t k = 1; k < sources; ++k) sum += load_as_float(src[k].data(), dtype, i);
            store_from_float(expected.data(), dtype, i, sum);
          }
          // dst is the last source: the kernel must read every source before it writes.
          void* dst = src.back().data();
          sum_in_order(dst, pointers.data(), sources, dtype, n, KernelOptions{2});
          EXPECT_EQ(src.back(), expected) << dtype_name(dtype) << " sources=" << sources
                                          << " n=" << n << " path=" << path_name(path);
        }
      }
    }
  }
  reset_kernel_isa_for_testing();
}

// Every destination gets src's bytes exactly, whatever the alignment of each (the AVX2 path's
// non-temporal stores start at a destination's 32-byte boundary) and across the kernel's
// 64 KiB pieces; nothing before or after a destination's range is touched.
TEST(CopyToAll, EveryDestinationGetsTheSourceExactly) {
  for (Path path : kAllPaths) {
    if (!use_path(path)) continue;
    for (size_t count : {size_t{1}, size_t{3}}) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{31}, size_t{33}, size_t{200003}}) {
        for (size_t misalign : {size_t{0}, size_t{1}, size_t{7}, size_t{32}}) {
          std::vector<unsigned char> src(bytes + 1);
          for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
          const unsigned char* from = src.data() + 1;  // src misaligned too
          std::vector<std::vector<unsigned char>> out(count,
                                                      std::vector<unsigned char>(bytes + 80, 0xee));
          std::vector<void*> dsts;
          for (size_t k = 0; k < count; ++k) dsts.push_back(out[k].data() + misalign + k);
          copy_to_all(dsts.data(), count, from, bytes, KernelOptions{2});
          for (size_t k = 0; k < count; ++k) {
            const size_t at = misalign + k;
            const std::string what = "count " + std::to_string(count) + ", bytes " +
                                     std::to_string(bytes) + ", destination " + std::to_string(k) +
                                     " at +" + std::to_string(at) + ", path " + path_name(path);
            EXPECT_EQ(0, std::memcmp(out[k].data() + at, from, bytes)) << what;
            for (size_t i = 0; i < out[k].size(); ++i) {
              if (i < at || i >= at + bytes) {
                ASSERT_EQ(out[k][i], 0xee) << what << ": byte " << i << " outside was written";
              }
            }
          }
        }
      }
    }
  }
  reset_kernel_isa_for_testing();
}

}  // namespace
}  // namespace zero::kernels
