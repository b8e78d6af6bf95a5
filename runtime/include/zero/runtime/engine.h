// The ZeRO engine: owns the layout and the buffers of the chosen stage, and exposes the
// primitives every schedule is built from:
//
//   prefetch(u) / gather(u)  make unit u's full parameters available (stage 3 all-gathers into
//                            a pooled buffer; stages 1-2 wait for the post-step all-gather)
//   release(u)               stage 3: give the gathered buffer back once compute is done
//   grads_ready(u)           unit u's backward for this micro-batch is complete: reduce now
//                            (stages 0-1 on the last micro-batch, stages 2-3 every one),
//                            behind the rest of backward (nothing for a frozen unit); stage
//                            3's persistent unit after the whole backward of the micro-batch
//   step()                   finish reductions, global-norm clip, update each rank's shard
//
// Stage by stage (fp32 working dtype, Ψ padded parameters, N ranks):
//   0: full params, full grads, full Adam state         16Ψ    all-reduce grads
//   1: full params, full grads, Adam state of the shard  8Ψ+8Ψ/N   reduce-scatter per unit
//                                                                  after its last micro-batch,
//                                                                  all-gather params after step
//   2: full params, grad shard, Adam state of the shard  4Ψ+12Ψ/N  reduce-scatter per unit in
//                                                                  backward, all-gather after
//   3: param shard, grad shard, Adam state of the shard  16Ψ/N     all-gather before forward
//                                                                  and backward, reduce-scatter
// Collectives run on the communicator's stream; the engine joins it to compute with events.
// The buffers live on config.device: host memory with the MPI communicator, or a CUDA GPU with
// the NCCL one (the engine's own host-side exchanges then go over MPI: host_communicator()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/optimizer/loss_scaler.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/device.h"
#include "zero/runtime/init.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/memory.h"
#include "zero/runtime/trace.h"

namespace zero {

// Where model state lives below the engine's own memory (DeepSpeed's offload_optimizer and
// offload_param devices). kCpu is host memory: on the CPU path that is where state already is.
enum class OffloadDevice { kNone, kCpu, kNvme };
const char* offload_device_name(OffloadDevice device);

// offload_optimizer, with DeepSpeed's defaults (stages 1-3). With kCpu (ZeRO-Offload) each
// rank's fp32 master (of fp32 working parameters too) and optimizer state live in host memory
// (page-locked with pin_memory): each unit's reduced gradient shard is copied there (into a
// page-locked copy) as soon as it is ready,
// behind the rest of backward; the step runs the CPU kernels on the host, sub-group by
// sub-group, and copies each sub-group's updated working parameters back to the device while
// the next is stepped. On the CPU path the same schedule runs with the copies inside host memory
// (which is how it is tested there); the config drops "cpu" there, where it would only copy.
// With kNvme each rank's fp32 master (when the working dtype is not fp32; fp32's master is the
// working parameters, but on a GPU it is kept too) and optimizer state live in one file under
// nvme_path, and the step streams them through buffer_count staging buffers of one sub-group
// (sub_group_size elements) each. On a GPU those are page-locked host memory and each sub-group
// is stepped there as with kCpu: the gradient shards copied to the host during backward, the
// updated parameters copied back.
struct OptimizerOffload {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path = "/local_nvme";
  // kCpu: the master and optimizer state in page-locked memory, which the device's copies
  // reach at full speed (the gradient and parameter copies always are). No effect for kNvme.
  bool pin_memory = false;
  int buffer_count = 4;
  bool pipeline_read = false;   // read sub-group k+1 while k is stepped
  bool pipeline_write = false;  // write sub-group k-1 back while k is stepped
  bool fast_init = false;       // DeepSpeed's faster start for NVMe; no effect here
};

// offload_param, with DeepSpeed's defaults (stage 3 only; the config takes "cpu" and drops it
// with a note: on the CPU path parameter shards already live in host memory, and on CUDA it is
// not built yet). nvme (the CPU path): each rank's shard
// of every unit but the persistent one lives in a file under nvme_path and passes through
// buffer_count buffers, each sized to the largest shard, which must fit buffer_size elements.
// max_in_cpu has no effect: no shard is kept in memory beyond those buffers.
struct ParamOffload {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path = "/local_nvme";
  bool pin_memory = false;
  int buffer_count = 5;
  size_t buffer_size = 100000000;  // elements
  size_t max_in_cpu = 1000000000;  // elements
};

// aio: how the NVMe files are read and written (io_uring, O_DIRECT), with DeepSpeed's defaults.
struct AioConfig {
  size_t block_size = 1048576;   // bytes per request; a multiple of 4096
  int queue_depth = 8;           // requests in flight per I/O thread
  int intra_op_parallelism = 1;  // I/O threads one transfer is split over
  bool single_submit = false;    // true: one system call per request, not one per batch
  bool overlap_events = true;    // true: a completed request is replaced at once; false: the
                                 // next batch starts when the whole previous one completed
};

// Everything an engine is built from, one group per concern: what the model computes in
// (precision), how collectives and gathers are grouped and ordered (schedule), where model
// state lives below the engine's memory (offload), and which ranks share the work (grid). The
// DeepSpeed config (zero/runtime/config.h) fills it; a program may set it by hand.
struct EngineConfig {
  // Where the buffers live and the compute runs. A CUDA device needs a communicator on device
  // memory (make_nccl_communicator); the CPU one on host memory (make_mpi_communicator).
  Device device;
  int stage = 3;
  int micro_batches = 1;           // gradient accumulation steps per optimizer step
  float gradient_clipping = 0.0f;  // max global norm; 0 turns clipping off
  OptimizerConfig optimizer;       // optimizer.lr is the learning rate of a constant schedule
  LrScheduleConfig lr_schedule;    // any other schedule sets the rate of each step itself
  int kernel_threads = 1;
  uint64_t seed = 1;

  // Mixed precision. With bf16 or fp16 the parameters and gradients are 2-byte and each rank
  // keeps an fp32 master copy of its shard next to the Adam moments.
  struct Precision {
    DType dtype = DType::kFloat32;           // working dtype (bf16.enabled / fp16.enabled)
    bool reduce_in_fp32 = false;             // reduce gradients in fp32, not the working dtype
    float gradient_predivide_factor = 1.0f;  // divide before the reduction, the rest after
    LossScalerConfig loss_scaler;            // fp16 only
    // fp32 and bf16 steps with a non-finite gradient stop with an error naming the unit, unless
    // this is set: then the step is skipped, as fp16's loss scaler does.
    bool skip_nonfinite_steps = false;
    // Gradient accumulation over micro-batches (data_types.grad_accum_dtype). Absent: fp32 when
    // the working dtype is bf16 (as DeepSpeed's bf16 optimizer does), the working dtype
    // otherwise. Backward still writes the working dtype; each micro-batch is added into the
    // accumulator.
    std::optional<DType> grad_accum_dtype;
    // ZeRO++'s qwZ (zero_quantized_weights; stage 3): what stage 3's parameter all-gathers put
    // on the wire, as reduce_in_fp32 is what reductions put there. Each rank's shard of a
    // trainable unit crosses as int8 values with one fp32 scale per block of
    // kWeightQuantizationBlock elements (zero/kernels/quantize_math.h) and is dequantized into
    // the working dtype on arrival. The master, the optimizer state and each rank's own working
    // shard stay exact; the post-step all-gathers of the persistent unit, frozen units (DeepSpeed
    // quantizes those only with zero_quantized_nontrainable_weights) and stages 0-2 too.
    bool quantized_weights = false;
    // ZeRO++'s qgZ (zero_quantized_gradients; stage 3, CPU path): stage 3's gradient
    // reduce-scatters of at least kWeightQuantizationBlock elements per rank cross the wire as
    // int8 with an fp32 scale per block, reduced in two hops, inside each node and then across
    // nodes, each summed in fp32 in rank order (runtime/quantized_reduction.h); smaller ones,
    // and reduce_scatter false, stay exact. Accumulation and the optimizer stay exact.
    bool quantized_gradients = false;
  } precision;

  // Units and the grouping of collectives, with DeepSpeed's names (counts in elements; 0 turns
  // each limit off). Units stay the registered modules (merged only by merge_bytes); the other
  // keys only group and order collectives.
  struct Schedule {
    size_t merge_bytes = 0;  // see LayoutOptions::merge_bytes
    size_t alignment_bytes = 64;
    bool overlap_comm = true;    // false: every collective is waited for right away
    bool reduce_scatter = true;  // false: stages 2-3 all-reduce each bucket, keep the shard
    // reduce_bucket_size: gradient elements reduced in one collective; consecutive units whose
    // gradients are ready are packed into one collective up to it (0: one collective per unit).
    size_t reduce_bucket_elements = 0;
    // allgather_bucket_size: the same for the post-step parameter all-gathers of stages 1-2.
    size_t allgather_bucket_elements = 0;
    size_t prefetch_elements = 0;      // stage3_prefetch_bucket_size: elements gathered ahead of
                                       // use (0: one unit ahead)
    size_t persistence_threshold = 0;  // stage3_param_persistence_threshold: parameters with
                                       // fewer elements stay whole on every rank for the run
    size_t max_live_elements = 0;      // stage3_max_live_parameters: cap on gathered elements
    size_t max_reuse_distance = 0;     // stage3_max_reuse_distance: at the end of forward, keep
                                       // a unit gathered if backward needs it again within this
                                       // many gathered elements
    // sub_group_size: at most this many elements in one optimizer pass (0: every shard at once).
    // With NVMe offload also the unit of I/O: one sub-group's state is read, stepped, written.
    size_t optimizer_sub_group_elements = 0;
  } schedule;

  // Model state below the engine's memory (DeepSpeed's offload_optimizer, offload_param, aio).
  struct Offload {
    OptimizerOffload optimizer;
    ParamOffload param;
    AioConfig aio;
  } offload;

  // The ranks that share the work besides the engine's own communicator (its data-parallel
  // group, over which ZeRO shards).
  struct Grid {
    // Hybrid sharding (DeepSpeed MiCS's mics_shard_size; -1: off). With k (1 <= k < N, k
    // dividing the N ranks; stage 3, CPU path) the model state is sharded over shard groups of k
    // consecutive ranks and replicated across them: gradients are reduce-scattered inside the
    // group, then each shard is all-reduced across the replica group (the ranks at the same
    // position in every group); parameters are all-gathered inside the group only. Model state
    // per rank is 16Ψ/k at fp32. k = N is plain ZeRO-3.
    int mics_shard_size = -1;
    // ZeRO++'s hpZ (zero_hpz_partition_size; 1: off). With k > 1 (stage 3, CPU path; k must
    // divide the data-parallel ranks and equal the ranks per node that the communicator found,
    // ranks_per_node), a unit's first all-gather after a step also leaves this rank its 1/k
    // slice of the gathered unit (a secondary shard, working dtype, numel/k elements), and every
    // later gather of the unit until the next step (backward's) all-gathers the k secondary
    // shards over the node's ranks instead of the whole group: that traffic stays inside the
    // node. The step makes the secondary shards stale; the next gathers make them again.
    int hpz_partition_size = 1;

    // Tensor parallelism (Megatron's): the communicator of this rank's tensor-parallel group, on
    // the engine's memory (MPI on the CPU path, NCCL on a GPU; null: none), which the caller
    // owns and keeps alive with the engine. The model splits its layers over this group
    // (ParamSpec::split describes the slices). The global gradient norm and the overflow check
    // then add each rank's slices over the group and the replicated parameters once
    // (tensor-parallel rank 0's), as Megatron's clip does.
    Communicator* tensor_parallel = nullptr;
    // On a GPU, MPI communicators over the same ranks as the engine's (NCCL) communicator and as
    // tensor_parallel, for the host-side exchanges (checkpoints, metrics, traces): a process
    // grid's host_data_parallel and host_tensor_parallel. Null: the engine makes one over the
    // whole world, which is the engine's ranks without tensor parallelism (tensor parallelism on
    // a GPU needs both). On the CPU, optional: the engine's own communicator when null; another
    // over the same ranks keeps host exchanges (a step's loss sum, metrics) from queueing behind
    // the engine's collectives on its stream, such as the post-step all-gathers that the next
    // forward waits for unit by unit. host_tensor_parallel is unused on the CPU.
    Communicator* host_communicator = nullptr;
    Communicator* host_tensor_parallel = nullptr;

    // Pipeline parallelism: this engine holds one stage of a pipeline, the other stages' engines
    // the rest of the model (zero/runtime/pipeline_schedule.h).
    struct Pipeline {
      // Over the ranks at this rank's data- and tensor-parallel place in every stage, in host
      // memory (MPI; null: no pipeline). The gradient norm and the overflow check add every
      // stage's, so that all stages clip and skip alike.
      Communicator* stages = nullptr;
      // Full names of parameters this stage shares with another (the GPT-2's wte, on the first
      // and last stages): after the last micro-batch their gradients are summed over `ties` (the
      // ranks of both stages at this rank's tensor-parallel place, on the engine's memory; its
      // order fixes the sum's), so that both stages step with the gradient of every use.
      std::vector<std::string> tied_parameters;
      Communicator* ties = nullptr;
      // Whether this stage counts the tied parameters in the gradient norm (exactly one does).
      bool counts_ties_in_norm = true;
      // Stage 3 with several micro-batches in flight: every unit stays gathered from its first
      // use in a step until step() (ZeroModel's schedule holds them), instead of being gathered
      // for every micro-batch; the plan then keeps a gathered buffer for every unit.
      bool hold_gathered = false;
      // Stages 2-3 with several micro-batches in flight: each unit's gradient accumulates whole,
      // in the accumulation dtype, over the step's micro-batches and is reduced once after the
      // last (as stages 0-1 do), instead of after every micro-batch: m times fewer
      // reduce-scatters for a whole gradient per unit in memory, as PyTorch's pipelining with
      // FSDP2 trades them. Stage 3's persistent unit still reduces per micro-batch.
      bool reduce_once = false;
    } pipeline;
  } grid;

  // Diagnostics.
  // Record compute and collective spans (Engine::trace()) for a Chrome trace and overlap figures.
  // CPU only: the spans are host times, which on CUDA would be launch times, not run times.
  bool trace = false;
  // Per-rank budget for everything the engine allocates (0 = none). An allocation past it (or
  // one the system refuses) is an OutOfMemoryError naming the category, with the memory
  // summary and what the estimator says would fit: a higher stage, more ranks.
  uint64_t memory_limit_bytes = 0;
  // Ranks agree on every collective before running it (debug.collectives in the config;
  // ZERO_DEBUG=collectives turns it on for every communicator).
  bool desync_check = false;
};

struct ParamDecl {
  ParamSpec spec;
  ParamInit init;
  // This parameter's AdamW (decoupled) or SGD (coupled) decay, as a PyTorch parameter group
  // sets it; nullopt: the optimizer's weight_decay. GPT-2 decays only tensors of >= 2 dims.
  std::optional<float> weight_decay = std::nullopt;
  // False: frozen. All parameters of a module are frozen or none (an error otherwise). A frozen
  // module's unit has no gradient, no optimizer state and no fp32 master (its working
  // parameters are its values); it is never reduced or updated, and the gradient norm and
  // clipping leave it out. Engine::grad() of a frozen parameter is null.
  bool trainable = true;
};

struct StepStats {
  long step = 0;           // optimizer steps taken so far (1 after the first; skips don't count)
  float grad_norm = 0.0f;  // global norm of the averaged, unscaled gradient, before clipping
  float lr = 0.0f;
  bool clipped = false;
  bool skipped = false;     // the gradients overflowed: nothing was updated
  float loss_scale = 1.0f;  // the scale the next backward uses (fp16; 1 otherwise)
  // Communication since the previous step() returned, measured on the CPU path where it
  // happens (0 on CUDA): collectives issued; time the communication stream spent running them
  // (busy); and time compute was exposed to them (wait): for each wait, from when compute needed
  // the result (the wait itself; the issue, with overlap_comm off) until the stream had it,
  // as the stream stamped it. Overlap is 1 - wait / busy.
  int collectives = 0;
  double comm_busy_ms = 0.0;
  double comm_wait_ms = 0.0;
  // The update of this rank's slices (0 for a skipped step): its wall time, I/O included (on
  // CUDA, where the kernels run asynchronously, the host's time to issue them); with
  // optimizer state on NVMe, how long it was blocked waiting for transfers and the bytes it read
  // and wrote, and nvme_busy_ms how long its state file had transfers outstanding during the
  // update: optimizer_ms / nvme_busy_ms near 1 means the kernels ran while the disk worked,
  // and optimizer_ms - nvme_busy_ms is the compute the I/O did not hide.
  // With parameters on NVMe (offload_param) the bytes also count every shard read for an
  // all-gather or an update and written back since the previous step() returned, the wait also
  // the step's blocking on them, and nvme_param_read_wait_ms is how long the communication
  // stream waited for shard reads before their all-gathers (the reads not hidden by prefetch).
  double optimizer_ms = 0.0;
  double nvme_wait_ms = 0.0;
  double nvme_busy_ms = 0.0;
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
  double nvme_param_read_wait_ms = 0.0;
  // The peak bytes of the model's activations and checkpoints together, and of the checkpoints
  // alone, since the previous step() returned, as the engine's allocator counted them (a model
  // counts its activations there through Tensor's allocator constructor; 0 when it does not).
  uint64_t peak_activation_bytes = 0;
  uint64_t peak_checkpoint_bytes = 0;
};

class Engine {
 public:
  // Builds the layout, checks that every rank registered the same model (an error names the
  // first parameter that differs), allocates the stage's buffers and initializes parameters.
  Engine(Communicator& comm, const std::vector<ParamDecl>& params, const EngineConfig& config);
  // Waits for collectives still in flight (their buffers are about to be freed).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Layout& layout() const;
  const EngineConfig& config() const;
  // The communicator of the collectives on the engine's buffers: the shard group's with hybrid
  // sharding (mics_shard_size), else the one the engine was given.
  Communicator& communicator();
  // A communicator on host memory over the engine's ranks, for small host-side exchanges
  // (checkpoint agreement, traces, metrics): the one the engine was given on the CPU, an MPI
  // communicator over the same ranks on CUDA (EngineConfig::host_communicator).
  Communicator& host_communicator();
  // The same over the tensor-parallel group (null without tensor parallelism): the group's
  // communicator on the CPU, EngineConfig::host_tensor_parallel on a GPU.
  Communicator* host_tensor_parallel() const;
  // The device's compute stream, memory and element operations; modules compute on it.
  const std::shared_ptr<DeviceContext>& device_context() const;
  Allocator& allocator();
  // The engine's allocators of host memory, which pinned_host_bytes() and pageable_host_bytes()
  // count: page-locked (the device's pinned_memory(), plain host memory on the CPU) for what
  // crosses the bus, and pageable for an offloaded optimizer's state without pin_memory.
  Allocator& pinned_host_allocator();
  Allocator& pageable_host_allocator();
  Trace& trace();

  void prefetch(int unit);
  void gather(int unit);
  void release(int unit);
  void grads_ready(int unit);
  StepStats step();

  // The full parameter of registration index `param`, in the working dtype, in the device's
  // memory (valid while its unit is gathered).
  void* param(int param);
  // Where backward accumulates the gradient of `param` for the current micro-batch, in the
  // working dtype (adds, as PyTorch's .grad does). Valid until the unit's grads_ready, and may
  // be written before the unit's own backward (a tied parameter's later user adds first).
  // Null for a frozen parameter.
  void* grad(int param);
  DType dtype() const;

  // Backward must multiply the loss (its gradient) by this: the fp16 loss scale, else 1.
  float loss_scale() const;
  // Elements of stage-3 units gathered right now (persistent units not counted).
  size_t live_elements() const;
  bool is_gathered(int unit) const;

  // Model-state bytes on this rank (params, grads, master, optimizer state) and the pooled
  // communication/prefetch buffers, as the allocator counts them.
  uint64_t model_state_bytes() const;
  uint64_t buffer_bytes() const;
  // Bytes this rank holds in host memory for an update that runs there (offload_optimizer kCpu,
  // and kNvme on a GPU; 0 otherwise): pinned, the host copies of the gradient shard and of the
  // updated working parameters, the NVMe staging slots on a GPU, and kCpu's master and
  // optimizer state with pin_memory; pageable, those two without it.
  uint64_t pinned_host_bytes() const;
  uint64_t pageable_host_bytes() const;
  // Bytes this rank sent (CommCounters) on the communicators the engine made itself: hybrid
  // sharding's shard and replica groups, hpZ's node group and qgZ's groups within and across
  // nodes (0 without; then every collective of the engine counts on the communicator it was
  // given). Read it from the thread that drives the engine.
  uint64_t own_comm_bytes() const;
  // Of own_comm_bytes, what qgZ sent across nodes (its second hop; 0 without qgZ).
  uint64_t quantized_bytes_across_nodes() const;
  // Bytes of this rank's NVMe files: optimizer state (offload_optimizer nvme) and parameter
  // shards (offload_param nvme); 0 without.
  uint64_t nvme_bytes() const;

  // Checkpoint access. For each unit, the fp32 training state this rank holds: elements
  // [begin, end) of the unit's flat layout (the whole unit at stage 0, the rank's shard
  // otherwise) of the master weights (the working parameters themselves when they are fp32)
  // and of each optimizer state array. A checkpoint saves the rank's shard of these and a load
  // overwrites them, then calls state_loaded(). The pointers are host memory: on CUDA, copies
  // made by state_view() that write_state_views() (or state_loaded()) writes back (valid until
  // then), as it does a copy of a shard on NVMe (offload_param) on both paths; with the optimizer
  // offloaded to the host (offload_optimizer kCpu), the state itself, which a write changes at
  // once (a load writes only after it has checked the whole checkpoint). A frozen unit's
  // master is its values (an fp32 copy for a 16-bit working dtype) and its optimizer state
  // zeros, so checkpoints keep one format and save and restore frozen values.
  struct StateView {
    size_t begin = 0;
    size_t end = 0;
    float* master = nullptr;
    float* state[2] = {nullptr, nullptr};
    int state_count = 0;
  };
  StateView state_view(int unit);
  // After the master and optimizer state were replaced: rewrites the working parameters from
  // the master (rounded to the working dtype) and gathers the full parameters where the stage
  // keeps them. Collective: every rank calls it.
  void state_loaded();
  // Writes what was written into the views handed out so far to where the state lives (the
  // device, the NVMe offload files) and frees their copies, so that a load filling one unit at a
  // time holds one unit's copies; state_loaded() still follows. Not collective.
  void write_state_views();
  // Frees the copies state_view() made (host copies on CUDA, copies of shards on NVMe), once they
  // are no longer needed without a state_loaded() (after a save, or a load that failed).
  void release_state_views();
  // Optimizer steps taken (the LR schedule's position), and the fp16 loss scaler's state.
  long optimizer_step() const;
  void set_optimizer_step(long step);
  LossScaler::State loss_scaler_state() const;
  void set_loss_scaler_state(const LossScaler::State& state);

  // The full working parameters, converted to fp32 (registration order, unpadded); collective:
  // every rank must call it. Used by tests and exports.
  std::vector<std::vector<float>> gather_full_params();
  // The full fp32 master weights (the working parameters themselves when they are fp32).
  std::vector<std::vector<float>> gather_full_master();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What the engine will allocate per rank for a layout and config (every rank holds the same
// amount): zero-estimate reports it before a run, model_state_bytes()/buffer_bytes() measure it
// during one, and the tests hold the two equal.
struct MemoryPlan {
  uint64_t model_state = 0;  // params, grads, master, optimizer state, in the engine's memory
  uint64_t buffers = 0;      // pooled gradient buckets, gathered-parameter buffers, fp32 scratch,
                             // NVMe staging buffers (the optimizer's: on the CPU path; on a GPU
                             // they are host_pinned)
  uint64_t nvme = 0;         // the rank's files of NVMe-offloaded optimizer state and params
  uint64_t nvme_params = 0;  // of nvme, the params' file (offload_param.nvme_path); the rest is
                             // the optimizer's (offload_optimizer.nvme_path)
  // What an update on the host keeps in host memory (offload_optimizer kCpu, and kNvme on a
  // GPU), as Engine::pinned_host_bytes() and pageable_host_bytes() measure it.
  uint64_t host_pinned = 0;
  uint64_t host_pageable = 0;
};
MemoryPlan plan_memory(const Layout& layout, const EngineConfig& config);

// The estimator's view of this model on other stages and more ranks, for an out-of-memory
// message: the plan (buffers included) for each stage on `world_size` ranks (those the state
// is sharded over) and for stage 3 on 2, 4 and 8 times as many, each marked when it fits in
// `budget` bytes (0: no budget to compare with).
std::string what_would_fit(const Layout& layout, const EngineConfig& config, int world_size,
                           uint64_t budget);

// The ranks the model state is sharded over: the shard group's size with hybrid sharding
// (mics_shard_size), else all world_size ranks. Throws for a mics_shard_size the world or the
// config cannot use, naming the values.
int sharding_group_size(const EngineConfig& config, int world_size);

// The layout the engine builds for a config on world_size ranks, sharded over
// sharding_group_size() of them (zero-estimate and the benchmarks plan with the same one).
LayoutOptions layout_options(const EngineConfig& config, int world_size);

}  // namespace zero
