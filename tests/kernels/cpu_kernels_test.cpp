// Every CPU kernel against a scalar reference written here from dtype.h and optimizer_math.h,
// on both paths, 1 and 2 threads, odd sizes and unaligned starts. The optimizer kernels must
// match the reference bit for bit (the engine compares ZeRO stages bitwise); AdamW is also
// checked against the textbook formula computed independently in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/kernel_paths.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_features.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/kernels/optimizer_math.h"

namespace zero::kernels::testing {
namespace {

// --- Scalar references ------------------------------------------------------------------------

void reference_adamw(GuardedBuffer& master, GuardedBuffer& m, GuardedBuffer& v,
                     const GuardedBuffer& grad, float grad_scale, GuardedBuffer* param_out,
                     const AdamWStepConstants& c) {
  for (size_t i = 0; i < master.size(); ++i) {
    float g = grad.get(i) * grad_scale;
    adamw_update(master.floats()[i], m.floats()[i], v.floats()[i], g, c);
    if (param_out) param_out->set(i, master.floats()[i]);
  }
}

void reference_sgd(GuardedBuffer& master, GuardedBuffer* momentum_buf, const GuardedBuffer& grad,
                   float grad_scale, GuardedBuffer* param_out, const SgdStepConstants& c) {
  for (size_t i = 0; i < master.size(); ++i) {
    float unused = 0.0f;
    float& buf = momentum_buf ? momentum_buf->floats()[i] : unused;
    sgd_update(master.floats()[i], buf, grad.get(i) * grad_scale, c);
    if (param_out) param_out->set(i, master.floats()[i]);
  }
}

// Sum of squares in plain sequential double: the value sum_squares approximates.
double reference_sum_squares(const GuardedBuffer& x) {
  double total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) total += static_cast<double>(x.get(i)) * x.get(i);
  return total;
}

// Same bits in every element, and nothing written outside the buffer.
::testing::AssertionResult same_bits(const GuardedBuffer& actual, const GuardedBuffer& expected) {
  size_t at = first_difference(actual, expected);
  if (at != actual.size()) {
    return ::testing::AssertionFailure() << "first difference at element " << at << ": "
                                         << actual.get(at) << " vs " << expected.get(at);
  }
  if (!actual.guards_intact()) return ::testing::AssertionFailure() << "wrote outside its range";
  return ::testing::AssertionSuccess();
}

// Calls `check(dtype, n, offset)` for every dtype, size and misalignment, each named in what a
// failure reports.
template <typename Check>
void for_each_dtype_size_offset(Check&& check) {
  for (DType dtype : kDTypes) {
    for (size_t n : kSizes) {
      for (size_t offset : kOffsets) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " n=" << n << " offset=" << offset);
        check(dtype, n, offset);
      }
    }
  }
}

// --- Optimizers -------------------------------------------------------------------------------

class OptimizerKernelTest : public KernelPathTest {};
ZERO_INSTANTIATE_PATHS(OptimizerKernelTest);

TEST_P(OptimizerKernelTest, AdamWMatchesScalarReferenceBitwise) {
  std::mt19937 rng(1234);
  const std::vector<bool> param_out_choices = {false, true};
  for (bool decoupled : {true, false}) {
    AdamWStepConstants c = adamw_step_constants(1e-3f, 0.9, 0.999, 1e-8f, 0.01f, 3, decoupled);
    for (DType grad_dtype : kDTypes) {
      for (int out_choice = 0; out_choice <= 3; ++out_choice) {  // 0: no param_out
        DType param_dtype = out_choice == 0 ? DType::kFloat32 : kDTypes[out_choice - 1];
        for (size_t n : kSizes) {
          for (size_t offset : kOffsets) {
            SCOPED_TRACE(::testing::Message()
                         << "decoupled=" << decoupled << " grad=" << dtype_name(grad_dtype)
                         << " param_out=" << (out_choice ? dtype_name(param_dtype) : "none")
                         << " n=" << n << " offset=" << offset);
            GuardedBuffer master(DType::kFloat32, n, offset), m(DType::kFloat32, n, offset + 1),
                v(DType::kFloat32, n, offset + 2), grad(grad_dtype, n, offset + 3),
                out(param_dtype, n, offset);
            fill_uniform(master, rng, 1.0f);
            fill_uniform(m, rng, 0.1f);
            fill_uniform(v, rng, 0.01f, /*non_negative=*/true);
            fill_uniform(grad, rng, 2.0f);
            // Signed zeros and empty moments, where the order of operations decides the bits.
            for (size_t i = 0; i < n; i += 13) grad.set(i, -0.0f);
            for (size_t i = 5; i < n; i += 29) {
              m.set(i, -0.0f);
              v.set(i, 0.0f);
            }
            GuardedBuffer want_master = master, want_m = m, want_v = v, want_out = out;
            const float grad_scale = 0.37f;
            reference_adamw(want_master, want_m, want_v, grad, grad_scale,
                            out_choice ? &want_out : nullptr, c);
            fused_adamw(master.floats(), m.floats(), v.floats(), grad.data(), grad_dtype,
                        grad_scale, out_choice ? out.data() : nullptr, param_dtype, n, c,
                        options());
            EXPECT_TRUE(same_bits(master, want_master)) << "master";
            EXPECT_TRUE(same_bits(m, want_m)) << "m";
            EXPECT_TRUE(same_bits(v, want_v)) << "v";
            EXPECT_TRUE(same_bits(out, want_out)) << "param_out";
            EXPECT_TRUE(grad.guards_intact());
          }
        }
      }
    }
  }
}

// Working copies of kStreamingMinElements or more are written with non-temporal stores after a
// scalar head that aligns them: every alignment of the copy (0-7 elements off a 64-byte line)
// must give the reference's bits. (An array off its element's alignment is not an array of that
// type in C++, so none is tried: UBSan stops such a store.)
TEST_P(OptimizerKernelTest, AdamWStreamedWorkingCopyMatchesScalarReferenceBitwise) {
  std::mt19937 rng(99);
  const AdamWStepConstants c = adamw_step_constants(1e-3f, 0.9, 0.999, 1e-8f, 0.01f, 2);
  const size_t n = detail::kStreamingMinElements + 37;
  for (DType param_dtype : kDTypes) {
    for (size_t offset = 0; offset < 8; ++offset) {
      SCOPED_TRACE(::testing::Message()
                   << "param_out=" << dtype_name(param_dtype) << " offset=" << offset);
      GuardedBuffer master(DType::kFloat32, n, 0), m(DType::kFloat32, n, 0),
          v(DType::kFloat32, n, 0), grad(DType::kBFloat16, n, 0);
      fill_uniform(master, rng, 1.0f);
      fill_uniform(m, rng, 0.1f);
      fill_uniform(v, rng, 0.01f, /*non_negative=*/true);
      fill_uniform(grad, rng, 2.0f);
      GuardedBuffer want_master = master, want_m = m, want_v = v;
      GuardedBuffer want_out(param_dtype, n, 0);
      reference_adamw(want_master, want_m, want_v, grad, 1.0f, &want_out, c);
      // The copy is written into a 64-byte aligned array, `offset` elements after a line,
      // between guard bytes, and read back into a GuardedBuffer to compare.
      const size_t element = dtype_size(param_dtype);
      const size_t start = offset * element;
      std::vector<unsigned char> bytes(64 + start + n * element + 128, 0xA5);
      const size_t align = (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
      unsigned char* out = bytes.data() + align + 64 + start;
      fused_adamw(master.floats(), m.floats(), v.floats(), grad.data(), DType::kBFloat16, 1.0f, out,
                  param_dtype, n, c, options());
      GuardedBuffer got_out(param_dtype, n, 0);
      std::memcpy(got_out.data(), out, n * element);
      EXPECT_TRUE(same_bits(master, want_master)) << "master";
      EXPECT_TRUE(same_bits(m, want_m)) << "m";
      EXPECT_TRUE(same_bits(v, want_v)) << "v";
      EXPECT_TRUE(same_bits(got_out, want_out)) << "param_out";
      EXPECT_EQ(out[n * element], 0xA5) << "wrote past the working copy";
      EXPECT_EQ(out[-1], 0xA5) << "wrote before the working copy";
    }
  }
}

// The textbook update, computed in double from scratch: three steps of AdamW (decoupled decay)
// and of Adam (L2 decay), starting from zero moments.
TEST_P(OptimizerKernelTest, AdamWFollowsTextbookFormulaOverThreeSteps) {
  const size_t n = 19;  // two vectors and a tail
  const double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1;
  for (bool decoupled : {true, false}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    std::vector<double> p(n), m(n, 0.0), v(n, 0.0);
    GuardedBuffer master(DType::kFloat32, n, 1), mf(DType::kFloat32, n, 2),
        vf(DType::kFloat32, n, 3), grad(DType::kFloat32, n, 1);
    for (size_t i = 0; i < n; ++i) {
      p[i] = static_cast<float>(0.5 - 0.05 * static_cast<double>(i));
      master.set(i, static_cast<float>(p[i]));
      mf.set(i, 0.0f);
      vf.set(i, 0.0f);
    }
    for (int t = 1; t <= 3; ++t) {
      for (size_t i = 0; i < n; ++i) {
        // Positive gradients keep the moments away from cancellation, so 1e-6 is a fair bound.
        float g = static_cast<float>(0.05 + 0.01 * static_cast<double>(i) + 0.02 * t);
        grad.set(i, g);
        double gd = g;
        if (!decoupled) gd += weight_decay * p[i];
        m[i] = beta1 * m[i] + (1 - beta1) * gd;
        v[i] = beta2 * v[i] + (1 - beta2) * gd * gd;
        double m_hat = m[i] / (1 - std::pow(beta1, t));
        double v_hat = v[i] / (1 - std::pow(beta2, t));
        if (decoupled) p[i] -= lr * weight_decay * p[i];
        p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      }
      AdamWStepConstants c =
          adamw_step_constants(static_cast<float>(lr), beta1, beta2, static_cast<float>(eps),
                               static_cast<float>(weight_decay), t, decoupled);
      fused_adamw(master.floats(), mf.floats(), vf.floats(), grad.data(), DType::kFloat32, 1.0f,
                  nullptr, DType::kFloat32, n, c, options());
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(master.get(i), p[i], 1e-6 * std::fabs(p[i]) + 1e-9)
            << "step " << t << " i " << i;
        EXPECT_NEAR(mf.get(i), m[i], 1e-6 * std::fabs(m[i]) + 1e-9) << "step " << t << " i " << i;
        EXPECT_NEAR(vf.get(i), v[i], 1e-6 * std::fabs(v[i]) + 1e-12) << "step " << t << " i " << i;
      }
    }
  }
}

TEST_P(OptimizerKernelTest, SgdMatchesScalarReferenceBitwise) {
  std::mt19937 rng(99);
  struct Case {
    float momentum;
    bool first_step;
  };
  for (Case mode : {Case{0.0f, false}, Case{0.9f, true}, Case{0.9f, false}}) {
    SgdStepConstants c{0.05f, mode.momentum, 1e-4f, mode.first_step};
    for (DType grad_dtype : kDTypes) {
      for (int out_choice = 0; out_choice <= 3; ++out_choice) {
        DType param_dtype = out_choice == 0 ? DType::kFloat32 : kDTypes[out_choice - 1];
        for (size_t n : kSizes) {
          for (size_t offset : kOffsets) {
            SCOPED_TRACE(::testing::Message()
                         << "momentum=" << mode.momentum << " first=" << mode.first_step
                         << " grad=" << dtype_name(grad_dtype) << " out=" << out_choice
                         << " n=" << n << " offset=" << offset);
            GuardedBuffer master(DType::kFloat32, n, offset), buf(DType::kFloat32, n, offset + 1),
                grad(grad_dtype, n, offset + 2), out(param_dtype, n, offset + 3);
            fill_uniform(master, rng, 1.0f);
            fill_uniform(buf, rng, 0.5f);
            fill_uniform(grad, rng, 1.0f);
            GuardedBuffer want_master = master, want_buf = buf, want_out = out;
            bool with_buffer = mode.momentum != 0.0f;
            reference_sgd(want_master, with_buffer ? &want_buf : nullptr, grad, 0.5f,
                          out_choice ? &want_out : nullptr, c);
            fused_sgd(master.floats(), with_buffer ? buf.floats() : nullptr, grad.data(),
                      grad_dtype, 0.5f, out_choice ? out.data() : nullptr, param_dtype, n, c,
                      options());
            EXPECT_TRUE(same_bits(master, want_master)) << "master";
            EXPECT_TRUE(same_bits(buf, want_buf)) << "momentum buffer";
            EXPECT_TRUE(same_bits(out, want_out)) << "param_out";
          }
        }
      }
    }
  }
}

// --- Element-wise kernels ---------------------------------------------------------------------

class ElementwiseKernelTest : public KernelPathTest {};
ZERO_INSTANTIATE_PATHS(ElementwiseKernelTest);

// Random bit patterns cover NaN, infinity, subnormals, overflow and every exponent. fp16 NaNs
// may come out of F16C with a different payload than the scalar conversion; they stay NaN.
TEST_P(ElementwiseKernelTest, CastMatchesScalarReferenceForAllDtypePairs) {
  std::mt19937 rng(7);
  for (DType from : kDTypes) {
    for (DType to : kDTypes) {
      for (size_t n : kSizes) {
        for (size_t offset : kOffsets) {
          SCOPED_TRACE(::testing::Message() << dtype_name(from) << "->" << dtype_name(to)
                                            << " n=" << n << " offset=" << offset);
          GuardedBuffer src(from, n, offset), dst(to, n, (offset + 1) % 4), want(to, n, 0);
          fill_random_bits(src, rng);
          for (size_t i = 0; i < n; ++i) want.set(i, src.get(i));
          cast(src.data(), from, dst.data(), to, n, options());
          size_t at = first_difference(dst, want, /*nan_payloads_may_differ=*/true);
          EXPECT_EQ(at, n) << "first difference at " << at << ": bits " << std::hex
                           << (at < n ? dst.bits(at) : 0) << " vs " << (at < n ? want.bits(at) : 0)
                           << " from " << (at < n ? src.bits(at) : 0);
          EXPECT_TRUE(dst.guards_intact());
        }
      }
    }
  }
}

TEST_P(ElementwiseKernelTest, SumSquaresMatchesDoubleSumAndIsPathAndThreadIndependent) {
  std::mt19937 rng(11);
  for_each_dtype_size_offset([&](DType dtype, size_t n, size_t offset) {
    GuardedBuffer x(dtype, n, offset);
    fill_uniform(x, rng, 3.0f);
    double got = sum_squares(x.data(), dtype, n, options());
    double want = reference_sum_squares(x);
    EXPECT_NEAR(got, want, 1e-12 * want);
    // The summation order is fixed (kernel_paths.h): the scalar path on one thread gives the
    // same bits as any path on any thread count.
    use_path(Path::kScalar);
    double scalar_one_thread = sum_squares(x.data(), dtype, n);
    use_path(path());
    EXPECT_EQ(got, scalar_one_thread);
  });
}

TEST_P(ElementwiseKernelTest, SumSquaresOfHalfPrecisionValues) {
  // Values exactly representable in bf16 and fp16, with squares easy to add by hand.
  const std::vector<float> values = {0.5f, -1.5f, 2.0f, 3.0f, -0.25f, 8.0f, 0.0f, 1.0f, -4.0f};
  const double want = 0.25 + 2.25 + 4 + 9 + 0.0625 + 64 + 0 + 1 + 16;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    GuardedBuffer x(dtype, values.size(), 1);
    for (size_t i = 0; i < values.size(); ++i) x.set(i, values[i]);
    EXPECT_EQ(sum_squares(x.data(), dtype, values.size(), options()), want) << dtype_name(dtype);
  }
  // 65504 is the largest fp16; its square overflows fp32 but not the double accumulator.
  GuardedBuffer big(DType::kFloat16, 17, 0);
  for (size_t i = 0; i < 17; ++i) big.set(i, 65504.0f);
  EXPECT_EQ(sum_squares(big.data(), DType::kFloat16, 17, options()), 17.0 * 65504.0 * 65504.0);
}

TEST_P(ElementwiseKernelTest, AllFiniteFindsNanAndInfAtEveryPosition) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for_each_dtype_size_offset([&](DType dtype, size_t n, size_t offset) {
    // The largest finite value of each dtype is finite.
    const float largest = dtype == DType::kFloat32    ? std::numeric_limits<float>::max()
                          : dtype == DType::kBFloat16 ? bf16_to_float(0x7f7f)
                                                      : 65504.0f;
    GuardedBuffer x(dtype, n, offset);
    for (size_t i = 0; i < n; ++i)
      x.set(i, i % 3 == 0 ? -largest : 0.5f * static_cast<float>(i % 1000));
    // Guard bytes of 0xA5 are finite; the element just past the end is made a NaN below to
    // prove the kernel stops at n.
    EXPECT_TRUE(all_finite(x.data(), dtype, n, options()));
    std::vector<size_t> positions;
    if (n <= 40) {
      for (size_t i = 0; i < n; ++i) positions.push_back(i);
    } else {
      for (size_t i : {size_t{0}, size_t{1}, n / 2, n - 17, n - 9, n - 8, n - 2, n - 1}) {
        positions.push_back(i);
      }
    }
    for (size_t position : positions) {
      for (float special : specials) {
        float saved = x.get(position);
        x.set(position, special);
        EXPECT_FALSE(all_finite(x.data(), dtype, n, options()))
            << special << " at " << position << " not found";
        x.set(position, saved);
      }
    }
  });
}

TEST_P(ElementwiseKernelTest, AllFiniteReadsNothingPastTheEnd) {
  for (DType dtype : kDTypes) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{15}, size_t{17}, size_t{4099}}) {
      GuardedBuffer x(dtype, n + 1, 2);
      for (size_t i = 0; i < n; ++i) x.set(i, 1.0f);
      x.set(n, std::numeric_limits<float>::quiet_NaN());
      EXPECT_TRUE(all_finite(x.data(), dtype, n, options())) << dtype_name(dtype) << " n=" << n;
      EXPECT_FALSE(all_finite(x.data(), dtype, n + 1, options()))
          << dtype_name(dtype) << " n=" << n;
    }
  }
}

TEST_P(ElementwiseKernelTest, AccumulateMatchesReference) {
  std::mt19937 rng(5);
  for (size_t n : kSizes) {
    for (size_t offset : kOffsets) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << offset);
      GuardedBuffer dst(DType::kFloat32, n, offset), src(DType::kFloat32, n, 3 - offset);
      fill_uniform(dst, rng, 1.0f);
      fill_uniform(src, rng, 1.0f);
      GuardedBuffer want = dst;
      for (size_t i = 0; i < n; ++i) want.floats()[i] += src.floats()[i];
      accumulate(dst.floats(), src.floats(), n, options());
      EXPECT_TRUE(same_bits(dst, want)) << "accumulate";
    }
  }
}

TEST_P(ElementwiseKernelTest, ScaleMatchesReference) {
  std::mt19937 rng(6);
  for_each_dtype_size_offset([&](DType dtype, size_t n, size_t offset) {
    GuardedBuffer x(dtype, n, offset);
    fill_uniform(x, rng, 100.0f);
    GuardedBuffer want = x;
    const float alpha = 1.0f / 3.0f;
    for (size_t i = 0; i < n; ++i) want.set(i, want.get(i) * alpha);
    scale(x.data(), dtype, alpha, n, options());
    EXPECT_TRUE(same_bits(x, want)) << "scale";
  });
}

TEST_P(ElementwiseKernelTest, FlattenAndUnflattenRoundTrip) {
  std::mt19937 rng(8);
  for (DType dtype : kDTypes) {
    // Tensors of odd sizes at aligned offsets with gaps between them, one of them empty, and a
    // large one so two threads split the copy inside a tensor.
    const std::vector<size_t> sizes = {5, 0, 64, 1000, 150001, 3};
    std::vector<GuardedBuffer> tensors;
    std::vector<TensorSlot> slots;
    size_t next = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
      tensors.emplace_back(dtype, sizes[t], t % 4);
      fill_uniform(tensors.back(), rng, 1.0f);
      slots.push_back({tensors.back().data(), next, sizes[t]});
      next = (next + sizes[t] + 32 + 31) / 32 * 32;  // leave a gap, start 32-aligned
    }
    for (size_t t = 0; t < slots.size(); ++t) slots[t].data = tensors[t].data();
    GuardedBuffer flat(dtype, next, 1);
    fill_random_bits(flat, rng);
    GuardedBuffer flat_before = flat;
    flatten(slots.data(), slots.size(), flat.data(), dtype, options());
    EXPECT_TRUE(flat.guards_intact());
    for (size_t t = 0; t < slots.size(); ++t) {
      EXPECT_EQ(
          std::memcmp(static_cast<const char*>(flat.data()) + slots[t].offset * dtype_size(dtype),
                      tensors[t].data(), tensors[t].bytes()),
          0)
          << "tensor " << t << " not copied into flat";
    }
    // Gaps are untouched: compare every element that belongs to no tensor.
    std::vector<bool> covered(next, false);
    for (const TensorSlot& slot : slots) {
      for (size_t i = 0; i < slot.numel; ++i) covered[slot.offset + i] = true;
    }
    for (size_t i = 0; i < next; ++i) {
      if (!covered[i]) {
        ASSERT_EQ(flat.bits(i), flat_before.bits(i)) << "gap element " << i << " written";
      }
    }
    // Unflatten into fresh tensors and compare with the originals.
    std::vector<GuardedBuffer> copies;
    std::vector<TensorSlot> copy_slots_list = slots;
    for (size_t t = 0; t < sizes.size(); ++t) copies.emplace_back(dtype, sizes[t], (t + 1) % 4);
    for (size_t t = 0; t < slots.size(); ++t) copy_slots_list[t].data = copies[t].data();
    unflatten(flat.data(), copy_slots_list.data(), copy_slots_list.size(), dtype, options());
    for (size_t t = 0; t < slots.size(); ++t) {
      EXPECT_EQ(first_difference(copies[t], tensors[t]), sizes[t]) << "tensor " << t;
      EXPECT_TRUE(copies[t].guards_intact()) << "tensor " << t;
    }
  }
}

// --- Arguments and path selection ---------------------------------------------------------------

TEST(KernelArguments, BadInputIsRefusedWithAnError) {
  float x[4] = {};
  AdamWStepConstants c = adamw_step_constants(1e-3f, 0.9, 0.999, 1e-8f, 0.0f, 1);
  EXPECT_THROW(fused_adamw(nullptr, x, x, x, DType::kFloat32, 1.0f, nullptr, DType::kFloat32, 4, c),
               zero::Error);
  EXPECT_THROW(fused_adamw(x, x, x, x, static_cast<DType>(7), 1.0f, nullptr, DType::kFloat32, 4, c),
               zero::Error);
  SgdStepConstants sgd{0.1f, 0.9f, 0.0f, false};
  EXPECT_THROW(fused_sgd(x, nullptr, x, DType::kFloat32, 1.0f, nullptr, DType::kFloat32, 4, sgd),
               zero::Error);
  KernelOptions zero_threads;
  zero_threads.threads = 0;
  EXPECT_THROW(accumulate(x, x, 4, zero_threads), zero::Error);
  EXPECT_THROW(sum_squares(nullptr, DType::kFloat32, 1), zero::Error);
  // Empty ranges accept null pointers.
  EXPECT_NO_THROW(fused_adamw(nullptr, nullptr, nullptr, nullptr, DType::kFloat32, 1.0f, nullptr,
                              DType::kFloat32, 0, c));
  EXPECT_EQ(sum_squares(nullptr, DType::kBFloat16, 0), 0.0);
  EXPECT_TRUE(all_finite(nullptr, DType::kFloat16, 0));
  void* nowhere[2] = {x, nullptr};
  EXPECT_THROW(copy_to_all(nowhere, 1, nullptr, 4), zero::Error);
  EXPECT_THROW(copy_to_all(nowhere, 2, x, 4), zero::Error);
  EXPECT_NO_THROW(copy_to_all(nowhere, 2, nullptr, 0));
  try {
    cast(x, DType::kFloat32, nullptr, DType::kBFloat16, 4);
    ADD_FAILURE() << "cast into a null buffer was accepted";
  } catch (const zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cast: dst is null"), std::string::npos) << e.what();
  }
}

// Also registered with ZERO_KERNELS_SCALAR=1 and ZERO_KERNELS_ISA=avx2 (tests/kernels/
// CMakeLists.txt), where the same checks see the environment cap the path.
TEST(KernelSelection, PathFollowsCpuAndEnvironment) {
  const char* scalar_env = std::getenv("ZERO_KERNELS_SCALAR");
  const char* isa_env = std::getenv("ZERO_KERNELS_ISA");
  const bool forces_scalar =
      (scalar_env != nullptr && scalar_env[0] != '\0' && std::string(scalar_env) != "0") ||
      (isa_env != nullptr && std::string(isa_env) == "scalar");
  const bool caps_avx2 = isa_env != nullptr && std::string(isa_env) == "avx2";
  const CpuFeatures& f = cpu_features();
  const bool avx2_capable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                            __builtin_cpu_supports("fma");
  const bool avx512_capable =
      avx2_capable && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  EXPECT_EQ(f.has_avx2_set(), avx2_capable);
  EXPECT_EQ(f.has_avx512_set(), avx512_capable);
  const KernelIsa want = forces_scalar || !avx2_capable ? KernelIsa::kScalar
                         : caps_avx2 || !avx512_capable ? KernelIsa::kAvx2
                                                        : KernelIsa::kAvx512;
  reset_kernel_isa_for_testing();
  EXPECT_EQ(kernel_isa_name(best_kernel_isa()), std::string(kernel_isa_name(want)));
  EXPECT_EQ(kernel_isa(), want);
  EXPECT_EQ(cpu_has_avx2(), want != KernelIsa::kScalar);
  force_scalar_for_testing(true);
  EXPECT_FALSE(cpu_has_avx2());
  EXPECT_EQ(kernel_isa(), KernelIsa::kScalar);
  // Nothing above the best path can be forced.
  EXPECT_EQ(force_kernel_isa_for_testing(KernelIsa::kAvx512), want == KernelIsa::kAvx512);
  force_scalar_for_testing(false);
  EXPECT_EQ(kernel_isa(), want);
  EXPECT_NE(kernel_summary().find(std::string("kernels ") + kernel_isa_name(want)),
            std::string::npos)
      << kernel_summary();
}

// cpuid's flags against the kernel's (/proc/cpuinfo), which also checks the OS saves the state.
TEST(KernelSelection, CpuFeaturesMatchProcCpuinfo) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  std::string line, flags_line, model_line;
  while (std::getline(cpuinfo, line)) {
    if (flags_line.empty() && line.rfind("flags", 0) == 0) flags_line = line + " ";
    if (model_line.empty() && line.rfind("model name", 0) == 0) model_line = line;
  }
  ASSERT_FALSE(flags_line.empty());
  const CpuFeatures& f = cpu_features();
  auto listed = [&](const char* flag) {
    return flags_line.find(std::string(" ") + flag + " ") != std::string::npos;
  };
  // Each flag of CpuFeatures by its name in /proc/cpuinfo.
  const std::pair<bool CpuFeatures::*, const char*> flags[] = {
      {&CpuFeatures::avx2, "avx2"},
      {&CpuFeatures::fma, "fma"},
      {&CpuFeatures::f16c, "f16c"},
      {&CpuFeatures::avx512f, "avx512f"},
      {&CpuFeatures::avx512bw, "avx512bw"},
      {&CpuFeatures::avx512vl, "avx512vl"},
      {&CpuFeatures::avx512dq, "avx512dq"},
      {&CpuFeatures::avx512cd, "avx512cd"},
      {&CpuFeatures::avx512_bf16, "avx512_bf16"},
      {&CpuFeatures::avx512_fp16, "avx512_fp16"},
      {&CpuFeatures::amx_tile, "amx_tile"},
      {&CpuFeatures::amx_bf16, "amx_bf16"}};
  for (const auto& [flag, name] : flags) EXPECT_EQ(f.*flag, listed(name)) << name;
  EXPECT_NE(model_line.find(f.model), std::string::npos) << model_line << " vs " << f.model;
}

}  // namespace
}  // namespace zero::kernels::testing
