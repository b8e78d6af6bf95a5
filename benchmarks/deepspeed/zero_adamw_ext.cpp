// Our fused AdamW and a STREAM triad as a PyTorch extension, so that
// benchmarks/deepspeed_cpu_adam.py can time them in the same process as DeepSpeed's CPUAdam, on
// the same tensors. Linked against the project's libzero_kernels.a.
#include <torch/extension.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "zero/kernels/cpu_kernels.h"

namespace {

// One AdamW step (decoupled weight decay, bias correction) over fp32 tensors, in place.
void adamw(torch::Tensor params, torch::Tensor grads, torch::Tensor exp_avg,
           torch::Tensor exp_avg_sq, int64_t step, double lr, double beta1, double beta2,
           double eps, double weight_decay, int64_t threads) {
  TORCH_CHECK(params.is_contiguous() && grads.is_contiguous() && exp_avg.is_contiguous() &&
              exp_avg_sq.is_contiguous());
  TORCH_CHECK(params.scalar_type() == torch::kFloat32 && grads.scalar_type() == torch::kFloat32);
  const zero::AdamWStepConstants c =
      zero::adamw_step_constants(static_cast<float>(lr), beta1, beta2, static_cast<float>(eps),
                                 static_cast<float>(weight_decay), static_cast<long>(step));
  zero::kernels::KernelOptions opt;
  opt.threads = static_cast<int>(threads);
  zero::kernels::fused_adamw(params.data_ptr<float>(), exp_avg.data_ptr<float>(),
                             exp_avg_sq.data_ptr<float>(), grads.data_ptr<float>(),
                             zero::DType::kFloat32, 1.0f, nullptr, zero::DType::kFloat32,
                             static_cast<size_t>(params.numel()), c, opt);
}

// Runs run(begin, end) over [0, n) in contiguous chunks on multiples of 64 elements, one per
// thread, the calling thread taking the first: how zero-bench-optimizer's StreamTriad splits.
template <typename Run>
void split_over_threads(size_t n, int64_t threads, const Run& run) {
  const size_t count = static_cast<size_t>(std::max<int64_t>(threads, 1));
  const size_t chunk = ((n + count - 1) / count + 63) / 64 * 64;
  std::vector<std::thread> workers;
  for (size_t begin = chunk; begin < n; begin += chunk) {
    workers.emplace_back(run, begin, std::min(n, begin + chunk));
  }
  run(0, std::min(n, chunk));
  for (std::thread& worker : workers) worker.join();
}

// a = b + s * c, the loop zero-bench-optimizer's StreamTriad runs.
void triad(torch::Tensor a, torch::Tensor b, torch::Tensor c, double s, int64_t threads) {
  float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  const float* pc = c.data_ptr<float>();
  const float scalar = static_cast<float>(s);
  split_over_threads(static_cast<size_t>(a.numel()), threads, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) pa[i] = pb[i] + scalar * pc[i];
  });
}

// AdamW's memory traffic without its arithmetic: read p, g, m, v and write p, m, v, one add each
// (28 bytes per parameter, every written line read first), each array's line 256 elements ahead
// prefetched as our AdamW loop does. What this loop reaches is about the most any fp32 AdamW can
// on this machine at this thread count, DeepSpeed's and ours alike.
void adamw_traffic(torch::Tensor p, torch::Tensor g, torch::Tensor m, torch::Tensor v,
                   int64_t threads) {
  float* pp = p.data_ptr<float>();
  const float* pg = g.data_ptr<float>();
  float* pm = m.data_ptr<float>();
  float* pv = v.data_ptr<float>();
  constexpr size_t kLine = 16;    // floats per 64-byte line
  constexpr size_t kAhead = 256;  // elements, as kernel_loops.h's kPrefetchDistance
  split_over_threads(static_cast<size_t>(p.numel()), threads, [=](size_t begin, size_t end) {
    size_t i = begin;
    for (; i + kLine <= end; i += kLine) {
      if (i + kAhead < end) {
        __builtin_prefetch(pp + i + kAhead);
        __builtin_prefetch(pg + i + kAhead);
        __builtin_prefetch(pm + i + kAhead);
        __builtin_prefetch(pv + i + kAhead);
      }
      for (size_t j = i; j < i + kLine; ++j) {
        pp[j] += pg[j];
        pm[j] += pg[j];
        pv[j] += pg[j];
      }
    }
    for (; i < end; ++i) {
      pp[i] += pg[i];
      pm[i] += pg[i];
      pv[i] += pg[i];
    }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("adamw", &adamw, "zero::kernels::fused_adamw on fp32 tensors, in place");
  m.def("triad", &triad, "STREAM triad a = b + s * c");
  m.def("adamw_traffic", &adamw_traffic, "AdamW's reads and writes, one add each");
}
