// What the GPT-2's modules share: parameter declarations, activation buffers, fp32 views of
// parameters and gradients, and the operations of the memory activations live in. Private to
// models/ (gpt2.cpp and gpt2_block.cpp).
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_ops.h"
#include "models/gpt2_tensor_parallel.h"
#include "zero/runtime/device.h"

namespace zero::models::gpt2_detail {

// GPT-2 initializes its weights from N(0, 0.02); the engine draws uniform values, so the bound
// gives the same standard deviation (a uniform in [-a, a) has std a / sqrt(3)).
inline float uniform_bound(float std) {
  return std * std::sqrt(3.0f);
}

// A parameter of the model. With decay_matrices_only, 1-D tensors (LayerNorm gains, biases) are
// in the group without weight decay, as GPT-2 recipes (and the PyTorch reference) put them.
inline ParamDecl param(const Gpt2Config& config, const char* name, std::vector<int64_t> shape,
                       ParamInit init) {
  ParamDecl decl{ParamSpec{name, std::move(shape), 0}, init};
  if (config.decay_matrices_only && decl.spec.shape.size() < 2) decl.weight_decay = 0.0f;
  return decl;
}

// A parameter the tensor-parallel group splits (gpt2_tensor_parallel.h): this rank's slice of
// the whole tensor of shape `whole`, with the split that cuts it.
inline ParamDecl split_param(const Gpt2Config& config, const char* name,
                             const std::vector<int64_t>& whole, ParamInit init) {
  ParamDecl decl = param(config, name, whole, init);
  decl.spec.split = gpt2_split_of(name, whole);
  decl.spec.shape = slice_shape(decl.spec.split, whole, config.tensor_parallel_size);
  return decl;
}

// The device of tensors in a parameter's memory: null (host memory) on the CPU.
inline std::shared_ptr<DeviceContext> device_memory(const std::shared_ptr<DeviceContext>& device) {
  return device && device->device().is_cuda() ? device : nullptr;
}

// `tensor` holding `shape`, reallocated (zero-filled) only when its size changes: activations
// keep their memory from one micro-batch to the next.
inline void ensure(Tensor& tensor, std::vector<int64_t> shape,
                   const std::shared_ptr<DeviceContext>& on) {
  size_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<size_t>(d);
  if (tensor.numel() != numel || tensor.device() != on) tensor = Tensor(std::move(shape), on);
}

inline uint64_t bytes_of(const Tensor& t) {
  return t.numel() * sizeof(float);
}

// Where a kernel adds a parameter's gradient: the gradient storage itself when it is fp32;
// otherwise a zeroed fp32 scratch, added into the 16-bit storage by flush_grad (rounding once).
inline float* grad_target(const ParamRef& grad, Tensor& scratch) {
  if (grad.dtype == DType::kFloat32) return static_cast<float*>(grad.data);
  ensure(scratch, {static_cast<int64_t>(grad.numel)}, device_memory(grad.device));
  grad.device->zero(scratch.data(), grad.numel * sizeof(float));
  return scratch.data();
}

inline void flush_grad(const ParamRef& grad, const Tensor& scratch) {
  if (grad.dtype != DType::kFloat32) grad.add_f32(scratch.data());
}

// Whether a module's products may take bf16 inputs: its parameters' working copies are bf16
// (mixed precision), so its weights are bf16 values already.
inline bool bf16_products(const std::vector<ParamRef>& params) {
  return !params.empty() && params[0].dtype == DType::kBFloat16;
}

// A parameter's values in fp32 and the target of its gradient, one per parameter of a module.
struct ParamSlots {
  std::vector<Tensor> values;  // fp32 copies of 16-bit parameters
  std::vector<Tensor> grads;   // fp32 gradients of 16-bit parameters
  // The gradients the products add into directly (matrix_grad) until the next flush.
  std::vector<bool> added_directly;

  explicit ParamSlots(size_t count) : values(count), grads(count), added_directly(count, false) {}
  const float* value(const std::vector<ParamRef>& params, size_t i) {
    return params[i].as_f32(values[i]);
  }
  // A weight matrix for the products: its bf16 working copy as it is where `ops` take bf16
  // weights (after set_bf16_products), with no fp32 copy made; else its fp32 values.
  kernels::MatrixWeight matrix(const std::vector<ParamRef>& params, size_t i, const Gpt2Ops& ops) {
    if (ops.takes_bf16_weights() && params[i].dtype == DType::kBFloat16) {
      return kernels::MatrixWeight::bf16(static_cast<const uint16_t*>(params[i].data));
    }
    return value(params, i);
  }
  float* grad(const std::vector<ParamRef>& grads_in, size_t i) {
    return grad_target(grads_in[i], grads[i]);
  }
  // A weight matrix's gradient for the products: its bf16 gradient as it is where `ops` take
  // bf16 weights (the products add into it, rounding each value once), with no fp32 copy to
  // zero, fill and add; else grad()'s.
  kernels::MatrixGradient matrix_grad(const std::vector<ParamRef>& grads_in, size_t i,
                                      const Gpt2Ops& ops) {
    if (ops.takes_bf16_weights() && grads_in[i].dtype == DType::kBFloat16) {
      added_directly[i] = true;
      return kernels::MatrixGradient::bf16(static_cast<uint16_t*>(grads_in[i].data));
    }
    return grad(grads_in, i);
  }
  void flush(const std::vector<ParamRef>& grads_in) {
    for (size_t i = 0; i < grads_in.size(); ++i) {
      if (!added_directly[i]) flush_grad(grads_in[i], grads[i]);
      added_directly[i] = false;
    }
  }
  // The copies' bytes (gpt2_held_module_copies).
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const Tensor& t : values) total += t.numel() * sizeof(float);
    for (const Tensor& t : grads) total += t.numel() * sizeof(float);
    return total;
  }
};

// The operations of the memory a module's activations live in, made at first use and shared by
// every module of the model (one cuBLAS handle, one copy of the targets).
class Gpt2Backend {
 public:
  explicit Gpt2Backend(int threads) : threads_(threads) {}

  // The tensor-parallel group (gpt2_tensor_parallel.h); without one, a group of this rank alone.
  void set_tensor_parallel(const Gpt2TensorParallel& tensor_parallel) {
    tensor_parallel_ = tensor_parallel;
  }
  // data (n floats in the memory of `on`: host memory when null) summed over the
  // tensor-parallel group, in place: Megatron's all-reduce after a row-parallel matrix (forward)
  // and before a column-parallel one's input gradient is used (backward). Nothing without a
  // group.
  void all_reduce_tensor_parallel(float* data, size_t n, const std::shared_ptr<DeviceContext>& on) {
    if (tensor_parallel_.comm == nullptr) return;
    Communicator& comm = *tensor_parallel_.comm;
    in_order(on, [&] { return comm.all_reduce(data, data, n, DType::kFloat32); });
  }
  // recv (n floats per rank, in rank order) = every rank's send (n floats), over the group.
  void all_gather_tensor_parallel(const float* send, float* recv, size_t n,
                                  const std::shared_ptr<DeviceContext>& on) {
    Communicator& comm = *tensor_parallel_.comm;
    in_order(on, [&] { return comm.all_gather(send, recv, n, DType::kFloat32); });
  }
  // Whether this rank adds the replicated bias of a row-parallel matrix before the all-reduce
  // (one rank does, so the sum holds it once), and the position embedding likewise.
  bool adds_row_parallel_bias() const { return tensor_parallel_.rank == 0; }
  int tensor_parallel_rank() const { return tensor_parallel_.rank; }

  // Where the model's activations are counted (count_gpt2_activations); null: nowhere.
  void set_allocator(Allocator* allocator) { allocator_ = allocator; }

  // The context of tensors on `on`: the device's, or for host memory (null) a CPU context.
  DeviceContext& context_of(const std::shared_ptr<DeviceContext>& on) {
    if (on) return *on;
    if (!cpu_context_) cpu_context_ = DeviceContext::create(Device::cpu());
    return *cpu_context_;
  }
  // The pinned host memory of `device`, counted apart from the device's (cpu_checkpointing).
  Allocator& pinned_allocator(DeviceContext& device) {
    if (!pinned_) pinned_ = std::make_unique<Allocator>(device.pinned_memory());
    return *pinned_;
  }

  // An activation of the model: `tensor` holding `shape` in the memory of `on`, counted as
  // `category` in the allocator when there is one. Reallocated (zero-filled) only when its size,
  // memory or counting changes, and then freed first, so no peak holds both.
  void activation(Tensor& tensor, std::vector<int64_t> shape,
                  const std::shared_ptr<DeviceContext>& on,
                  MemoryCategory category = MemoryCategory::kActivation) {
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    const bool counted_right = tensor.allocator() == allocator_ &&
                               (allocator_ == nullptr || tensor.category() == category);
    if (tensor.numel() == numel && tensor.device() == on && counted_right) return;
    tensor = Tensor();
    tensor = allocator_ != nullptr ? Tensor(std::move(shape), on, *allocator_, category)
                                   : Tensor(std::move(shape), on);
  }
  // `dest` = a copy of `source` (an activation as above, in source's memory).
  void keep_copy(Tensor& dest, const Tensor& source,
                 MemoryCategory category = MemoryCategory::kActivation) {
    activation(dest, source.shape(), source.device(), category);
    copy_into(dest.data(), source);
  }
  // source's elements to `dest`, in the same memory.
  static void copy_into(float* dest, const Tensor& source) {
    copy_floats(dest, source.data(), source.numel(), source.device());
  }
  // n floats from `source` to `dest`, both in the memory of `on` (null: host memory).
  static void copy_floats(float* dest, const float* source, size_t n,
                          const std::shared_ptr<DeviceContext>& on) {
    if (n == 0) return;
    if (on) {
      on->copy(dest, source, n * sizeof(float));
    } else {
      std::memcpy(dest, source, n * sizeof(float));
    }
  }

  Gpt2Ops& ops_for(const Tensor& t) {
    if (!t.device()) {
      if (!cpu_) cpu_ = make_cpu_gpt2_ops(threads_);
      return *cpu_;
    }
    if (!cuda_ || cuda_device_ != t.device()) {
      cuda_ = make_cuda_gpt2_ops(t.device());
      cuda_device_ = t.device();
    }
    return *cuda_;
  }

 private:
  // Runs a collective of the group between the work before it and after it: on a GPU (the
  // group's communicator is then NCCL's) the collective's stream waits for the compute stream
  // and the compute stream for the collective, on the device; in host memory it blocks.
  template <typename Collective>
  void in_order(const std::shared_ptr<DeviceContext>& on, Collective collective) {
    if (!on) {
      collective().wait();
      return;
    }
    tensor_parallel_.comm->stream().wait(on->record());
    on->wait(collective());
  }

  int threads_;
  Gpt2TensorParallel tensor_parallel_;
  Allocator* allocator_ = nullptr;
  std::shared_ptr<DeviceContext> cpu_context_;
  std::unique_ptr<Allocator> pinned_;
  std::unique_ptr<Gpt2Ops> cpu_;
  std::unique_ptr<Gpt2Ops> cuda_;
  std::shared_ptr<DeviceContext> cuda_device_;
};

}  // namespace zero::models::gpt2_detail
