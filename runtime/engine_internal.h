// The engine's insides, shared by the files that implement it (private to runtime/):
//   engine.cpp           construction: validation, the same-model check, allocation, init
//   memory_plan.cpp      what each stage holds: the single source for plan_memory() and for
//                        the engine's allocations, and the out-of-memory advice
//   engine_schedule.cpp  the primitives: gather, prefetch, release, parameter and gradient
//                        access
//   gradient_reducer.cpp the gradients: buffers, reductions, accumulation (GradientReducer)
//   comm_timeline.cpp    what the communication stream ran and how long compute waited for it
//   engine_step.cpp      step(): the reductions waited for, norm and overflow, update,
//                        post-step all-gathers
//   engine_state.cpp     checkpoint access: state views, state_loaded, full parameters
//   engine_offload.cpp   optimizer state on NVMe: the file's records, the streamed update, and
//                        the records read and written for checkpoint access
//   engine_host_optimizer.cpp  optimizer state in host memory (offload_optimizer cpu):
//                        the gradient shards' copies to the host, the update there, the
//                        parameters' copies back
//   param_swap.cpp       stage 3's parameter shards on NVMe (offload_param device nvme)
//   working_shards.cpp   where each unit's working shard lives, for every phase that uses it
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "buffer_pool.h"
#include "comm_timeline.h"
#include "gradient_reducer.h"
#include "memory_plan.h"
#include "node_shared_memory.h"
#include "param_swap.h"
#include "shard_store.h"
#include "unit_state.h"
#include "working_shards.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/nvme_file.h"
#include "zero/runtime/trace.h"

namespace zero {

// A unit's parameters, master and optimizer state (its gradients are the GradientReducer's).
struct UnitState {
  Buffer params_full;
  Buffer params_shard;
  Buffer master;
  Buffer state[2];         // master and state: in host memory with optimizer_on_host
  Buffer host_grads;       // steps_on_host: the reduced gradient shard's copy on the host
  Buffer host_params;      // and the updated parameters on their way back to the device
  CommPoint params_ready;  // the all-gather that fills params_full has finished
  // hpZ: this rank's 1/k of the gathered unit, which the node's gathers read; valid from the
  // first gather after a step (once `secondary_ready` has passed) until the next step.
  Buffer params_secondary;
  CommPoint secondary_ready;
  bool secondary_valid = false;
  ParamState params = ParamState::kSharded;
  bool persistent = false;
};

// Elements of a unit from `begin` (an element offset in the unit) up to the next run's begin
// (or the unit's end) are updated with this weight decay. Padding joins the run before it: it
// stays zero under any decay.
struct DecayRun {
  size_t begin = 0;
  float weight_decay = 0.0f;
};

// A frozen unit's view for a checkpoint: its values in fp32 (when the working dtype is not)
// and zero optimizer state, which the checkpoint format holds for every unit.
struct FrozenView {
  Buffer master;
  Buffer state[2];
};

// A run of one unit's owned elements [begin, begin + count) (offsets in the rank's slice) that
// one optimizer pass updates with one weight decay.
struct Piece {
  size_t unit = 0;
  size_t begin = 0;
  size_t count = 0;
  float weight_decay = 0.0f;
};

// With optimizer state on NVMe, the rank's file is one record per sub-group: the sub-group's
// elements (the trainable units' owned slices, concatenated in unit order, cut every
// sub_group_size elements, exactly as the update's passes are cut) of each offloaded array (the
// fp32 master when the working dtype is not fp32 or the device is a GPU, then each optimizer
// state array), each array
// padded to kNvmeAlignment so a record is read and written whole with O_DIRECT.
struct NvmeRecords {
  struct Record {
    uint64_t offset = 0;     // in the file
    size_t numel = 0;        // elements of the sub-group
    size_t array_bytes = 0;  // one array's bytes in the record (aligned); arrays follow each other
  };
  std::vector<Record> records;
  int arrays = 0;              // offloaded arrays per element
  bool master = false;         // whether array 0 is the master
  uint64_t file_bytes = 0;     // the rank's file
  size_t slot_bytes = 0;       // one staging buffer: the largest record
  uint64_t staging_bytes = 0;  // buffer_count slots and the slack to align them
};
bool offloads_optimizer_to_nvme(const EngineConfig& config);
bool offloads_optimizer_to_host(const EngineConfig& config);
// The update runs on the host, apart from the device's buffers, with host copies of each
// gradient shard and of the updated parameters: the optimizer offloaded to the host, and on a
// GPU to NVMe (whose records stream through host memory).
bool steps_on_host(const EngineConfig& config);
// The records for `layout` (every rank's are the same: shards are equal).
NvmeRecords nvme_records(const Layout& layout, const EngineConfig& config, int state_arrays);

// The engine's NVMe-offloaded optimizer state.
struct OffloadedOptimizer {
  NvmeRecords layout;
  std::vector<size_t> unit_first;  // unit -> first element of its owned slice in the sub-groups
  Buffer staging_memory;           // buffer_count slots (and alignment slack)
  char* slots = nullptr;           // the first aligned slot
  std::unique_ptr<NvmeFile> file;  // after the buffers: destroyed first, ending its transfers
  int cached = -1;                 // the record slot 0 holds for checkpoint access (-1: none)
  // state_view() copies of units' arrays, which write_state_views() writes back into the records.
  std::map<int, std::vector<Buffer>> views;
  // The last update's I/O: time blocked on transfers, time the file had transfers outstanding,
  // and bytes moved.
  double wait_ms = 0.0;
  double busy_ms = 0.0;
  uint64_t read_bytes = 0;
  uint64_t write_bytes = 0;
};

// The master and state in each unit's own buffers (device memory, or host memory with
// offload_optimizer cpu): nothing moves between passes, and checkpoint access gets the buffers.
class ResidentShards final : public ShardStore {
 public:
  ResidentShards(std::vector<UnitState>& units, const std::vector<std::vector<Piece>>& passes)
      : units_(units), passes_(passes) {}
  PieceArrays arrays(size_t pass, size_t piece) override;
  PieceArrays unit_arrays(int unit, size_t count) override;

 private:
  std::vector<UnitState>& units_;
  const std::vector<std::vector<Piece>>& passes_;
};

// The master and state in the rank's NVMe file, one record per pass (engine_offload.cpp): each
// record through a staging slot, read (ahead by one with pipeline_read), stepped, written (left
// in flight with pipeline_write, waited for when its slot is needed again). Slots are taken
// oldest first, so a slot's write is the earliest one issued. Checkpoint access copies a unit's
// arrays out of the records its slice spans into host memory (`host`), and writes them back.
class NvmeShards final : public ShardStore {
 public:
  NvmeShards(OffloadedOptimizer& offload, const std::vector<std::vector<Piece>>& passes,
             const OptimizerOffload& config, Allocator& host);
  void begin_update() override;
  void begin_pass(size_t pass) override;
  PieceArrays arrays(size_t pass, size_t piece) override;
  void end_pass(size_t pass) override;
  void end_update() override;
  void abandon() noexcept override;
  PieceArrays unit_arrays(int unit, size_t count) override;
  bool hands_out_copies() const override { return true; }
  void write_back_views(
      const std::function<void(int unit, const float* master)>& master_written) override;
  void release_view(int unit) override { o_.views.erase(unit); }
  void release_views() override { o_.views.clear(); }

 private:
  // Reads record k into slot 0 (kept there for the next unit of the same record).
  char* cached_record(size_t k);
  char* slot_memory(size_t slot) const;
  size_t record_bytes(size_t k) const;
  // Waits for a transfer, counting the time the update is blocked on the disk: what pipelining
  // exists to hide.
  void wait(const NvmeFile::Ticket& ticket);
  void start_read(size_t k);
  // Every write in flight waited for and its slot free again.
  void drain();

  OffloadedOptimizer& o_;
  const std::vector<std::vector<Piece>>& passes_;
  const OptimizerOffload& config_;
  Allocator& host_;
  std::vector<NvmeFile::Ticket> slot_ticket_;
  std::deque<size_t> free_slots_;
  std::deque<size_t> writing_;  // slots with a write in flight, oldest first
  std::vector<size_t> slot_of_;
  std::vector<NvmeFile::Ticket> read_of_;
  std::vector<size_t> at_of_;  // each piece of the current pass: its first element in the record
  double busy_before_ = 0.0;
};

// Hybrid sharding's communicators (engine_hybrid.cpp): the shard group the engine's
// collectives run on and the replica group its gradient shards are summed across; both null
// without hybrid sharding.
struct HybridGroups {
  // replica first: destroyed after shard, whose stream's queued work may still call it.
  std::unique_ptr<Communicator> replica;
  std::unique_ptr<Communicator> shard;
  // Checks mics_shard_size against the world and, when it asks for hybrid sharding, splits the
  // world (collective: every rank of `world` calls it).
  static HybridGroups split(Communicator& world, const EngineConfig& config);
};

struct Engine::Impl {
  Impl(Communicator& c, const std::vector<ParamDecl>& decls, const EngineConfig& cfg);

  // zero::what_would_fit for this engine's layout, config, ranks and limit.
  std::string what_would_fit() const;

  static EngineConfig validated(const EngineConfig& c, Communicator& comm);

  static std::vector<ParamSpec> specs_of(const std::vector<ParamDecl>& decls);

  // Each unit's weight-decay runs (ParamDecl::weight_decay, else the optimizer's), adjacent
  // parameters with the same decay in one run.
  std::vector<std::vector<DecayRun>> decay_runs_of(const std::vector<ParamDecl>& decls) const;

  // Compares the layout's fingerprint across ranks before any collective depends on it: a rank
  // with a different model would otherwise hang or corrupt data in a mismatched collective.
  void check_same_model_on_all_ranks();

  // On the CPU path: reserves node-shared memory for the buffers collectives read and write
  // (whole parameters and gradients, buckets, gathered parameters, the fusion and staging
  // buffers) and has the allocator place them there. Collective; before allocate().
  void place_collective_buffers();

  void allocate();

  // Fills the elements this rank holds; the value of each is a function of the seed and the
  // element's global identity only, so every world size starts from the same model. The working
  // copy is the master rounded to the working dtype, as after every optimizer step. Values are
  // made in host memory and copied to the device one buffer at a time.
  void initialize(const std::vector<ParamDecl>& decls);

  // The slice of a unit's elements this rank updates: the whole unit at stage 0 (every rank
  // updates all of it identically), its shard otherwise. Offsets in elements of the unit.
  ElementRange owned_range(size_t u) const {
    const size_t numel = layout.units()[u].numel;
    return config.stage == 0 ? ElementRange{0, numel} : shard_range(numel, rank, world);
  }

  // Stage 3: starts unit u's all-gather into a pooled buffer. An optional prefetch stays within
  // the live budget (stage3_max_live_parameters) and the planned buffers and says whether it
  // started; a required gather always starts.
  bool start_gather(int u, bool required);

  // Unit u's all-gather of this rank's `shard` into its params_full, issued at `issue_us`.
  CommPoint all_gather_unit(int u, const void* shard, double issue_us);
  // The same quantized (qwZ): the shard quantized on the communication stream, the int8 values
  // and scales all-gathered as bytes, every rank's region dequantized into params_full.
  CommPoint all_gather_unit_quantized(int u, const void* shard, double issue_us);

  // hpZ: after unit u's all-gather over the group (queued on the communication stream), this
  // rank's 1/k slice of it copied into its secondary shard, in the same stream's order; returns
  // the point after the copy.
  CommPoint keep_secondary_shard(int u, double issue_us);
  // hpZ: unit u's all-gather of the node's k secondary shards into its params_full, over the
  // node group (hpz_node), after compute and after the copy that made this rank's shard.
  CommPoint all_gather_unit_in_node(int u, double issue_us);
  // hpZ: elements of unit u's secondary shard (the unit's padding makes them equal).
  size_t secondary_numel(int u) const {
    return layout.units()[u].numel / static_cast<size_t>(config.grid.hpz_partition_size);
  }
  // hpZ: the secondary shards are stale once the parameters change (a step, a load).
  void invalidate_secondary_shards();

  bool prefetch(int u);

  void gather(int u);

  void release(int u);

  // One optimizer step in named phases: wait for the reductions, the global norm and overflow,
  // the update of each rank's slice, the all-gathers that bring the slices back.
  StepStats step();

  void check_ready_for_step() const;

  struct GradientCheck {
    std::vector<float> unit_sums;  // each unit's sum of squared gradients over all ranks
    float grad_norm = 0.0f;        // of the mean gradient of the global batch
    float to_mean = 1.0f;          // the factor that takes the reduced gradients to that mean
    bool overflow = false;
  };

  // One all-reduce of each unit's sum of squares over the shards gives the global norm, and
  // tells every rank at once whether (and in which unit) a gradient overflowed anywhere.
  GradientCheck check_gradients();
  // Unit u's sum of squared gradients over this rank's shard, of the parameters this rank
  // counts in the norm (counts_in_norm): each counted parameter's sum lands in `slot` (the
  // device's memory) and is added in double on the host.
  float counted_sum_squares(size_t u, float* slot);
  // Whether parameter p's gradient counts in this rank's part of the norm: a parameter
  // replicated over the tensor-parallel group on its rank 0 only, a pipeline tie on the stage
  // that counts ties only.
  bool counts_in_norm(int p) const;
  // Whether some parameter of unit u does not count (then counted_sum_squares sums the unit).
  bool unit_counts_partly(size_t u) const;

  // Pipeline ties (EngineConfig::Grid::Pipeline, engine_pipeline.cpp): the tied parameters'
  // indices, found and checked at construction; their gradients summed over the tie group before
  // the norm.
  void resolve_pipeline_ties();
  void sum_pipeline_ties();
  std::vector<int> pipeline_tied_params;

  // fp16 lets the loss scaler decide; fp32 and bf16 stop on a non-finite gradient, naming the
  // unit, unless told to skip such steps.
  bool skip_step(const GradientCheck& check);

  // Fused AdamW (or SGD) over what each rank owns, in passes of at most sub_group_size
  // elements (DeepSpeed's bound on what one optimizer pass touches); each unit's slice may be
  // cut into several pieces, which the element-wise update does not notice, and is cut where
  // the weight decay changes. Frozen units are left out. Each pass's master and state come from
  // `shards`; the pass is stepped on the device (apply_pass) or on the host
  // (apply_pass_on_host, where steps_on_host).
  void update(float lr, float grad_scale);

  // The passes of update(): each a list of pieces of at most sub_group_size elements in all.
  std::vector<std::vector<Piece>> plan_sub_groups() const;

  // One pass of update(): builds each piece's update with `make` (by index) and applies them;
  // with parameters on NVMe, unit by unit, each unit's shard brought into a buffer first (the
  // next unit's read started ahead) and written back after its last piece. The element-wise
  // update does not notice how the pieces are grouped.
  void apply_pass(const std::vector<Piece>& pieces, const std::function<ShardUpdate(size_t)>& make,
                  float grad_scale);
  // Whether unit u's update writes its whole working shard (from a master kept elsewhere), so
  // that the shard's old values need not be read; and, after `last` (a piece of u), u's shard
  // done with (WorkingShards::updated) when `last` ends the unit's slice.
  bool update_overwrites_shard(int u, bool on_host) const;
  void finish_piece(const Piece& last);

  // The piece's update with its master and state arrays where the store put them.
  ShardUpdate piece_update(const Piece& piece, const PieceArrays& arrays);

  // NVMe offload (engine_offload.cpp): creates the file and writes the initial master into it
  // (the update streams it through NvmeShards); and the unit's arrays read out of and written
  // back into the records for checkpoints.
  void open_offload(const std::vector<ParamDecl>& decls);
  // Refuses a run whose NVMe files (optimizer and parameters together where they share a
  // file system) do not fit the free space, before any file is made.
  void check_offload_space();

  // The update on the host (engine_host_optimizer.cpp; see steps_on_host). After unit u's last
  // reduction of the step: its reduced gradient shard to the host, on the communication stream
  // right behind that reduction (`reduced`) (so during backward). Returns the point the step
  // waits for: the copy's, or `reduced` where the update is not on the host (no host copy).
  CommPoint copy_grads_to_host(int u, const CommPoint& reduced);
  // update() on the host: the CPU kernels over each sub-group, whose updated working parameters
  // go back to the device while the next sub-group is stepped. Before the first pass, the
  // gradients' copies and the last step's uploads waited for; one pass of pieces whose master
  // and state make() points at (host memory), stepped with the gradients' host copies and its
  // parameters sent to the device; after the last pass, the device ordered after the uploads.
  void begin_host_update();
  void apply_pass_on_host(const std::vector<Piece>& pieces,
                          const std::function<ShardUpdate(size_t)>& make, float grad_scale);
  void end_host_update();
  // Unit u's working parameters from its owned fp32 master (host memory where steps_on_host,
  // else the device's), rounded to the working dtype.
  void set_working_params(size_t u, const float* master);
  // Until the last update's copies to the device have read their host side.
  void wait_for_host_uploads();

  // Brings every rank's updated slice back into the full parameters (stages 1-2, and stage
  // 3's persistent units); the next forward's gather(u) waits for unit u only, so the
  // all-gathers overlap with the forward. Frozen units only `with_frozen` (after a load):
  // no step changes them.
  void start_post_step_gathers(bool with_frozen = false);

  // One unit's all-gather of the rank slices into its full parameters (stages 1-2).
  void gather_one(int u);

  // An allgather_bucket_size pack (stages 1-2): each unit's updated slice into its place in
  // this rank's region of the fusion buffer, one all-gather of the regions, and every rank's
  // slice of each unit back into its full parameters.
  void gather_packed(const std::vector<int>& pack);

  float current_lr() const {
    return config.lr_schedule.type == LrScheduleType::kConstant
               ? config.optimizer.lr
               : schedule.lr_at(optimizer.step() + 1);
  }

  float loss_scale() const {
    return config.precision.dtype == DType::kFloat16 ? loss_scaler.scale() : 1.0f;
  }

  void check_unit(int u) const {
    ZERO_CHECK(u >= 0 && u < static_cast<int>(units.size()),
               "unit " << u << " does not exist; the model has " << units.size() << " units");
  }

  const ParamPlacement& placement(int p) const;

  void* param(int p);
  // Waits for the all-gather that last filled unit u's params_full: gathering -> gathered.
  void wait_for_params(int u);

  void* grad(int p);

  Engine::StateView state_view(int u);

  // Host memory for the n floats at `data`: the array itself on the CPU; on a GPU a fresh copy,
  // which write_state_views() writes back.
  float* host_view(float* data, size_t n);

  // A frozen unit's values as a state view: the working parameters (fp32) or an fp32 copy of
  // them, which write_state_views() writes back, and zero optimizer state.
  Engine::StateView frozen_state_view(int u);

  void state_loaded();

  void write_state_views();

  void release_state_views();

  std::vector<std::vector<float>> gather_full_params();

  std::vector<std::vector<float>> gather_full_master();

  HybridGroups hybrid;  // before comm, which is the shard group's with hybrid sharding
  Communicator& comm;
  EngineConfig config;
  std::shared_ptr<DeviceContext> device;  // before the allocator: its memory comes from here
  std::unique_ptr<Communicator> owned_host_comm;
  Communicator& host_comm;
  // The CPU path's collectives' buffers (place_collective_buffers); null when they stay in the
  // device's memory. Before the allocator, which hands out its memory.
  std::unique_ptr<NodeSharedMemory> node_shared;
  Allocator allocator;
  Allocator host_allocator;  // pinned host memory for the device's copies (host memory on the CPU)
  Allocator pageable_allocator;  // offload_optimizer cpu's state without pin_memory
  Layout layout;
  Optimizer optimizer;
  LrSchedule schedule;
  LossScaler loss_scaler;
  int rank;           // in the shard group (the world without hybrid sharding)
  int world;          // the ranks the state is sharded over
  int replicas;       // copies of each shard: the replica group's size (1 without hybrid sharding)
  size_t elem;        // bytes per element of the working dtype
  DType accum_dtype;  // of the kept gradients (see accumulation_dtype)
  size_t accum;       // and its bytes per element
  Trace trace;
  CommTimeline timeline;
  BufferPool param_pool;
  Buffer fusion;            // packed collectives (see pack_units); one at a time, in stream order
  Buffer quantized_gather;  // qwZ's int8 values and scales (quantized_gather_bytes)
  Buffer pipeline_tie_sum;  // fp32, the largest tied parameter's size (pipeline_tie_bytes)
  GradientReducer reducer;
  Buffer staging;  // the communicator's staging memory (set_staging_buffer)
  PackedCollectives gather_packs;
  Buffer norm_sums;          // each unit's sum of squared gradients, all-reduced at step()
  Buffer norm_sums_on_host;  // and their copy, which the host reads
  std::map<float*, Buffer> host_state;     // state_view() copies of device arrays (CUDA only)
  std::map<int, FrozenView> frozen_views;  // state_view() of frozen units, by unit
  std::vector<std::vector<DecayRun>> decay_runs;  // per unit
  std::vector<UnitState> units;
  std::vector<std::vector<Piece>> sub_groups;   // update()'s passes
  std::unique_ptr<OffloadedOptimizer> offload;  // optimizer state on NVMe, if offloaded
  std::unique_ptr<ShardStore> shards;  // where update() and state_view() find master and state
  std::unique_ptr<WorkingShards> working_shards;  // where each unit's working shard lives
  // offload_optimizer cpu: the last update's copies of parameters to the device, which the
  // host waits for before it writes their host side again.
  std::vector<Event> host_uploads;
  size_t live = 0;  // elements of non-persistent stage-3 units gathered now
  // hpZ's node group (split_node_group, engine_hybrid.cpp): the ranks of this rank's node in
  // the data-parallel group; null without hpZ. ~Engine waits for its stream, whose gathers write
  // pooled buffers.
  std::unique_ptr<Communicator> hpz_node;
};

// hpZ (EngineConfig::grid.hpz_partition_size > 1): checks k against `group` (it must divide its
// ranks and equal its ranks per node, ranks_per_node) and splits the group into nodes of k
// consecutive ranks; null with k = 1. Collective: every rank of `group` calls it.
std::unique_ptr<Communicator> split_node_group(Communicator& group, const EngineConfig& config);

}  // namespace zero
