// The engine's insides, shared by the files that implement it (private to runtime/):
//   engine.cpp           construction: validation, the same-model check, allocation, init
//   memory_plan.cpp      what each stage holds: the single source for plan_memory() and for
//                        the engine's allocations, and the out-of-memory advice
//   engine_schedule.cpp  the primitives: gather, prefetch, release, grads_ready, reductions
//   engine_step.cpp      step(): reduce, norm and overflow, update, post-step all-gathers
//   engine_state.cpp     checkpoint access: state views, state_loaded, full parameters
//   engine_offload.cpp   optimizer state on NVMe: the file's records, the streamed update, and
//                        the records read and written for checkpoint access
//   engine_host_optimizer.cpp  optimizer state in host memory (offload_optimizer cpu):
//                        the gradient shards' copies to the host, the update there, the
//                        parameters' copies back
//   param_swap.cpp       stage 3's parameter shards on NVMe (offload_param device nvme)
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm_point.h"
#include "node_shared_memory.h"
#include "param_swap.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/nvme_file.h"
#include "zero/runtime/trace.h"

namespace zero {

// Same-size buffers handed out and given back with the event after which they are free again
// (e.g. the reduce-scatter that reads a gradient bucket). Buffers come back in the order their
// collectives were issued and the communication stream runs them in that order, so handing out
// the oldest returned one (FIFO) takes the buffer that becomes free first: the one whose
// collective was just launched stays in flight while compute fills another (double buffering).
// The capacity is what the memory plan counts; only a required acquire goes past it.
class BufferPool {
 public:
  using Waiter = std::function<void(const CommPoint&)>;
  BufferPool(Allocator& allocator, DeviceContext& device, MemoryCategory category, size_t bytes,
             Waiter wait)
      : allocator_(allocator),
        device_(device),
        category_(category),
        bytes_(bytes),
        wait_(std::move(wait)) {}

  // Allocates the planned buffers ahead of use, so the memory report at start shows what the
  // schedule will hold.
  void reserve(size_t capacity) {
    capacity_ = capacity;
    while (allocated_ < capacity_) {
      free_.push_back(Entry{allocator_.allocate(bytes_, category_), {}});
      ++allocated_;
    }
  }

  // The buffer that becomes free first, ready for the compute stream. A required acquire with
  // every planned buffer handed out (units kept gathered past their use) allocates one more.
  Buffer acquire(bool zeroed) {
    if (free_.empty()) {
      ++allocated_;
      return allocator_.allocate(bytes_, category_);
    }
    Entry entry = std::move(free_.front());
    free_.pop_front();
    wait_(entry.free_after);
    if (zeroed) device_.zero(entry.buffer.data(), entry.buffer.bytes());
    return std::move(entry.buffer);
  }

  // For optional work (a prefetch): a buffer only while the plan's buffers are not all out.
  bool can_acquire_within_plan() const { return !free_.empty() || allocated_ < capacity_; }

  void give_back(Buffer buffer, CommPoint free_after) {
    free_.push_back(Entry{std::move(buffer), std::move(free_after)});
  }

 private:
  struct Entry {
    Buffer buffer;
    CommPoint free_after;
  };
  Allocator& allocator_;
  DeviceContext& device_;
  MemoryCategory category_;
  size_t bytes_;
  Waiter wait_;
  size_t capacity_ = 0;
  size_t allocated_ = 0;
  std::deque<Entry> free_;
};

// The packs of one kind of collective, and where each unit sits in its pack: the fusion buffer
// holds a pack as N rank regions (region r: shard r of every unit of the pack, in pack order),
// so one reduce-scatter or all-gather of the regions serves every unit at once.
struct PackedCollectives {
  std::vector<std::vector<int>> packs;
  std::vector<int> pack_of;       // unit -> its pack (-1: a frozen unit, in no pack)
  std::vector<size_t> offset_of;  // unit -> its offset inside a rank region, in elements
  std::vector<size_t> region;     // pack -> elements of one rank region
  int filling = -1;               // the pack whose units are being copied in, if any
  size_t filled = 0;              // and how many of them are in

  PackedCollectives() = default;
  PackedCollectives(const Layout& layout, size_t limit, bool backward);
  bool fused(int u) const { return pack_of[u] >= 0 && packs[pack_of[u]].size() > 1; }
};

// Bytes of staging memory a collective needs in the communicator: what the MPI backend sums
// 16-bit gradients in (fp32), given to it from the engine's allocator so that it is counted
// and under the memory limit.
using StagingBytes = std::function<size_t(CollectiveOp, size_t, DType)>;

// Bytes of each buffer one unit holds at a stage; the single source for plan_memory() and for
// the engine's allocations, so the estimate and the measurement cannot drift apart.
struct UnitBytes {
  size_t params_full = 0;   // working dtype, whole unit (stages 0-2; persistent units at 3)
  size_t params_shard = 0;  // working dtype, this rank's slice (stage 3)
  size_t master = 0;        // fp32 master when the working dtype is not fp32
  size_t grads_full = 0;    // accumulation dtype, whole unit (stages 0-1; working dtype for
                            // stage 3's persistent unit)
  size_t grads_shard = 0;   // accumulation dtype, slice (stages 2-3)
  size_t state = 0;         // each optimizer state array (fp32)
  int state_arrays = 0;
  // offload_optimizer cpu: master and state are in host memory (the master of fp32 working
  // parameters too). Where the update runs on the host (steps_on_host: also nvme on a GPU),
  // pinned host copies of the gradient shard (accumulation dtype) and of the updated parameters
  // (but fp32's when its master is kept and pinned) beside them.
  bool optimizer_on_host = false;
  size_t host_grads = 0;
  size_t host_params = 0;
};

// An issued reduction: when its input may be written again, and when its result is in place.
// They differ when the result lands elsewhere and is then summed across replicas (hybrid
// sharding) on another stream.
struct Reduction {
  CommPoint input_read;
  CommPoint done;
};

struct UnitState {
  Buffer params_full;
  Buffer params_shard;
  Buffer master;
  Buffer grads_full;  // stages 0-1: the reduced (and accumulated) gradient, accumulation dtype;
                      // stage 3's persistent unit: the micro-batch's gradient (working dtype),
                      // reduced into grads_shard at its grads_ready
  Buffer bucket;      // a pooled working-dtype gradient during backward (uses_grad_buckets)
  Buffer grads_shard;
  Buffer state[2];          // master and state: in host memory with optimizer_on_host
  Buffer host_grads;        // steps_on_host: the reduced gradient shard's copy on the host
  Buffer host_params;       // and the updated parameters on their way back to the device
  CommPoint params_ready;   // the all-gather that fills params_full has finished
  CommPoint grads_reduced;  // the reduction (and accumulation) of the latest grads_ready is done
  // The persistent unit: when its reduction has read grads_full, which the next micro-batch's
  // first grad() zeroes after that (grads_full_reused).
  CommPoint grads_full_read;
  bool grads_full_reused = false;
  bool gathered = false;
  bool persistent = false;
  int micro_batches_done = 0;
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

inline char* byte_offset(void* p, size_t bytes) {
  return static_cast<char*>(p) + bytes;
}

// The dtype gradients are accumulated in over micro-batches (data_types.grad_accum_dtype):
// DeepSpeed's bf16 optimizer accumulates in fp32, so bf16 does here unless told otherwise.
DType accumulation_dtype(const EngineConfig& config);

// Backward writes a micro-batch's gradient into a pooled bucket of the working dtype when what
// the rank keeps is a shard (stages 2-3) or is accumulated in another dtype; otherwise straight
// into the kept full gradient.
bool uses_grad_buckets(const EngineConfig& config);

// Gradient buckets: two, so that backward fills one while the other's reduction reads it,
// and one more for each unit a later module ties to (ParamSpec::tied), whose bucket is taken at
// the tying module's backward and held until the unit's own: without it, every unit between
// them would wait for the one before's reduction.
size_t grad_bucket_count(const Layout& layout, const EngineConfig& config);

// A bucket reduced in the working dtype needs fp32 scratch when the reduction runs in fp32.
bool needs_fp32_scratch(const EngineConfig& config);

// The dtype a gradient reduction puts on the wire, the same at every stage: fp32 when asked
// (communication_data_type), the working dtype otherwise (DeepSpeed's default). Stages 0-1
// accumulating in another dtype round the micro-batches' sum to it once, before the reduction.
DType reduction_dtype(const EngineConfig& config);

// Gathered-parameter buffers of stage 3: the unit computing, the next one in flight, and as
// many more as stage3_prefetch_bucket_size asks to have gathered ahead, and never more than
// the units there are to gather. Prefetches never take more, so the plan holds.
size_t param_buffer_count(const Layout& layout, const EngineConfig& config);

// allgather_bucket_size packs the post-step all-gathers of stages 1-2; stage 3 gathers each
// unit when it is needed, so nothing is packed there (0).
size_t gather_bucket_elements(const EngineConfig& config);

// The fusion buffer packed collectives go through: the larger of the gradient packs (in the
// reduction dtype) and the stage 1-2 parameter packs (working dtype).
size_t fusion_bytes(const Layout& layout, const EngineConfig& config);

// The most staging any of the engine's step collectives needs: each reduction (alone or
// packed) and the norm's all-reduce; all-gathers stage nothing.
size_t max_staging_bytes(const Layout& layout, const EngineConfig& config,
                         const StagingBytes& staging);

// Stage 3 keeps the persistent unit (the parameters under stage3_param_persistence_threshold)
// whole on every rank, and its gradient whole until the step, where it is reduced.
bool is_persistent(const Unit& unit, const EngineConfig& config);

UnitBytes unit_bytes(const Unit& unit, const EngineConfig& config, int state_arrays);

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

  // Wraps a collective issued on the communication stream with markers that run on that stream
  // right before and after it: the step's comm_busy_ms is what ran between them, and the trace
  // holds when the collective really ran, not when it was queued. The end marker is the point
  // returned, so whoever waits for the collective also waits until its span is closed, and a
  // compute span that starts after the wait cannot look overlapped. (CUDA runs enqueued host
  // work at issue, so there the figures would be issue times: only the CPU stream measures.)
  template <typename Issue>
  CommPoint traced(const char* name, uint64_t bytes, Issue issue) {
    return traced_on(comm.stream(), name, bytes, issue);
  }

  // The same for a collective issued on another communicator's stream `on` (the replica
  // group's).
  template <typename Issue>
  CommPoint traced_on(Stream& on, const char* name, uint64_t bytes, Issue issue) {
    ++collectives_issued;
    if (on.native_handle() != nullptr) return CommPoint{issue(), nullptr};
    auto begin_us = std::make_shared<double>(0.0);
    on.enqueue([begin_us] { *begin_us = Trace::now_us(); });
    issue();
    Trace* t = trace.enabled() ? &trace : nullptr;
    std::shared_ptr<std::atomic<int64_t>> busy = comm_busy_us;
    std::string span_name = name;
    auto end_us = std::make_shared<double>(0.0);
    Event end = on.enqueue([t, busy, begin_us, end_us, span_name, bytes] {
      *end_us = Trace::now_us();
      busy->fetch_add(static_cast<int64_t>(*end_us - *begin_us));
      if (t) t->add(TraceSpan{span_name, true, *begin_us, *end_us, bytes});
    });
    return CommPoint{std::move(end), std::move(end_us)};
  }

  bool measures_comm() const { return comm.stream().native_handle() == nullptr; }

  // The current end of the communication stream (or of `on`), stamped when the stream gets
  // there.
  CommPoint comm_point() { return comm_point(comm.stream()); }
  CommPoint comm_point(Stream& on);

  // The one place compute waits for communication. comm_wait_ms adds how long compute was
  // exposed to it, by the wall clock: from when compute needed the result (`needed_us`; now,
  // by default) until this thread goes on, when the stream had not got there yet.
  void wait_for_comm(const CommPoint& point, double needed_us = -1.0);

  // An issued collective: with overlap_comm off, compute needs it from the moment it was
  // issued (`issue_us`) and waits for it right away.
  CommPoint issued(CommPoint point, double issue_us);

  // The slice of a unit's elements this rank updates: the whole unit at stage 0 (every rank
  // updates all of it identically), its shard otherwise. Offsets in elements of the unit.
  size_t owned_begin(size_t u) const {
    return config.stage == 0 ? 0 : static_cast<size_t>(rank) * layout.units()[u].shard;
  }

  size_t owned_numel(size_t u) const {
    return config.stage == 0 ? layout.units()[u].numel : layout.units()[u].shard;
  }

  // This rank's working-dtype parameters the optimizer writes (see owned_begin).
  void* owned_params(size_t u);

  // The rank's reduced (and accumulated) gradient of what it owns, in accum_dtype.
  void* owned_grads(size_t u);

  // The rank's shard of the reduced gradient at every stage: the global norm is summed over
  // shards, so stage 0 (which owns whole units) adds up in the same order as the others.
  void* grad_shard(size_t u);

  // Sums `bucket` (the unit's whole gradient from this rank, `dtype`) over the ranks and leaves
  // this rank's reduced slice in `dest` (accum_dtype; added to it when `accumulate`). `last`:
  // the step's last micro-batch, after which hybrid sharding sums across replicas.
  Reduction reduce_to_shard(const Unit& unit, void* bucket, DType dtype, void* dest,
                            bool accumulate, bool last);

  // Hybrid sharding: sums `count` elements at `data`, just reduced inside the shard group,
  // across the replica group, in place, and returns the stream that whatever reads the sum must
  // be enqueued on: the replica group's, so that the shard group's stream goes on with its next
  // collective (a reduce-scatter, a prefetching all-gather) instead of queueing behind the
  // slower one across replicas. Without hybrid sharding: the communication stream, unchanged.
  Stream& sum_across_replicas(void* data, size_t count, DType dtype);

  // Before the shard group's stream writes fp32_scratch or the fusion buffer again: waits for
  // the replica stream's reads of them (see scratch_read_by_replicas).
  void wait_until_replicas_read_scratch();

  // Sums a whole unit's gradient (`dtype`) over the ranks into `dest` (accum_dtype; the
  // bucket itself when that is where the gradient is kept) (stage 0).
  CommPoint reduce_whole(const Unit& unit, void* bucket, DType dtype, void* dest);

  // The pre-divide keeps 16-bit sums over many ranks in range: divide by f before the sum,
  // multiply the f back in the optimizer's gradient scale.
  void prepare_for_reduction(void* bucket, DType dtype, size_t numel);

  // Stage 3: starts unit u's all-gather into a pooled buffer. An optional prefetch stays within
  // the live budget (stage3_max_live_parameters) and the planned buffers and says whether it
  // started; a required gather always starts.
  bool start_gather(int u, bool required);

  // Unit u's all-gather of this rank's `shard` into its params_full, issued at `issue_us`.
  CommPoint all_gather_unit(int u, const void* shard, double issue_us);

  bool prefetch(int u);

  void gather(int u);

  void release(int u);

  // Each unit's gradient is reduced as soon as it is final, behind the rest of backward (as
  // DDP does): stages 0-1 after the last micro-batch's backward of the unit, stages 2-3 after
  // every micro-batch's, whose bucket is then free for the next unit once that collective ran.
  void grads_ready(int u);

  // Reduces unit u's gradient `source` (`dtype`) into what the rank keeps of it, alone or as
  // part of its reduce_bucket_size pack; grads_reduced says when that is done. Returns the
  // event after which `source` may be reused.
  CommPoint reduce_unit(int u, void* source, DType dtype, bool accumulate, bool last);

  // A unit of a packed reduction: its gradient is copied into its place in every rank region
  // of the fusion buffer (in the reduction dtype); the pack's last unit issues the one
  // collective and copies each unit's reduced part out to what the rank keeps.
  CommPoint reduce_packed(int u, void* source, DType dtype, bool accumulate, bool last);

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
  float tensor_parallel_sum_squares(size_t u, float* slot);

  // fp16 lets the loss scaler decide; fp32 and bf16 stop on a non-finite gradient, naming the
  // unit, unless told to skip such steps.
  bool skip_step(const GradientCheck& check);

  // Fused AdamW (or SGD) over what each rank owns, in passes of at most sub_group_size
  // elements (DeepSpeed's bound on what one optimizer pass touches); each unit's slice may be
  // cut into several pieces, which the element-wise update does not notice, and is cut where
  // the weight decay changes. Frozen units are left out.
  void update(float lr, float grad_scale);

  // The passes of update(): each a list of pieces of at most sub_group_size elements in all.
  std::vector<std::vector<Piece>> plan_sub_groups() const;

  // One pass of update(): builds each piece's update with `make` (by index) and applies them;
  // with parameters on NVMe, unit by unit, each unit's shard brought into a buffer first (the
  // next unit's read started ahead) and written back after its last piece. The element-wise
  // update does not notice how the pieces are grouped.
  void apply_pass(const std::vector<Piece>& pieces, const std::function<ShardUpdate(size_t)>& make,
                  float grad_scale);
  // With parameters on NVMe, swapped unit u's buffer for its update (on a GPU, the device's, or
  // the host's when `on_host`: the host steps it): unread when the update writes the whole shard
  // from a master, else read in, with the next trainable unit's read started behind it; and,
  // after `last` (a piece of a swapped unit), the shard written back when `last` ends the unit's
  // slice.
  void* swap_in_for_update(int u, bool on_host);
  bool update_overwrites_shard(int u, bool on_host) const;
  void swap_out_after_update(const Piece& last);

  // A copy of a swapped unit's shard where the engine computes (device memory on a GPU) for
  // checkpoint access, read on first use; write_state_views() stores it back to its file and
  // release_state_views() drops it.
  void* param_copy(int u);

  // The piece's update with its master and state arrays at `master` and `state` (null master:
  // the working parameters are the master).
  ShardUpdate piece_update(const Piece& piece, float* master, float* const* state);
  // The same with the master (where the unit keeps one) and state in the unit's own buffers.
  ShardUpdate resident_piece_update(const Piece& piece);

  // NVMe offload (engine_offload.cpp): creates the file and writes the initial master into it;
  // update() with the sub-groups streamed through the staging buffers (read k + 1 and write
  // k - 1 while k is stepped, as pipeline_read and pipeline_write ask); and the unit's arrays
  // read out of and written back into the records for checkpoints.
  void open_offload(const std::vector<ParamDecl>& decls);
  // Refuses a run whose NVMe files (optimizer and parameters together where they share a
  // file system) do not fit the free space, before any file is made.
  void check_offload_space();
  void update_offloaded(float grad_scale);

  // The update on the host (engine_host_optimizer.cpp; see steps_on_host). After unit u's last
  // reduction of the step: its reduced gradient shard to the host, on the communication stream
  // right behind that reduction (so during backward); grads_reduced then includes the copy.
  // Nothing where the update is not on the host (the unit has no host copy).
  void copy_grads_to_host(int u);
  // update() on the host: the CPU kernels over each sub-group, whose updated working parameters
  // go back to the device while the next sub-group is stepped.
  void update_on_host(float grad_scale);
  // Its parts, which the NVMe update on a GPU shares: before the first pass, the gradients'
  // copies and the last step's uploads waited for; one pass of pieces whose master and state
  // make() points at (host memory), stepped with the gradients' host copies and its parameters
  // sent to the device; after the last pass, the device ordered after the uploads.
  void begin_host_update();
  void apply_pass_on_host(const std::vector<Piece>& pieces,
                          const std::function<ShardUpdate(size_t)>& make, float grad_scale);
  void end_host_update();
  // Unit u's working parameters from its owned fp32 master (host memory where steps_on_host,
  // else the device's), rounded to the working dtype.
  void set_working_params(size_t u, const float* master);
  // Until the last update's copies to the device have read their host side.
  void wait_for_host_uploads();
  Engine::StateView offloaded_state_view(int u);
  void write_back_offloaded_views();
  // Reads record k into slot 0 (kept there for the next unit of the same record).
  char* cached_record(int k);

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

  float loss_scale() const { return config.dtype == DType::kFloat16 ? loss_scaler.scale() : 1.0f; }

  // Gradients start from zero for the next step.
  void finish_step();

  void check_unit(int u) const {
    ZERO_CHECK(u >= 0 && u < static_cast<int>(units.size()),
               "unit " << u << " does not exist; the model has " << units.size() << " units");
  }

  const ParamPlacement& placement(int p) const;

  void* param(int p);
  // Waits for the all-gather that last filled the unit's params_full.
  void wait_for_params(UnitState& s);

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
  void store_param_copies();

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
  BufferPool param_pool;
  BufferPool grad_pool;
  Buffer fp32_scratch;  // reductions in fp32 of a 16-bit gradient (reduce_in_fp32)
  Buffer fusion;        // packed collectives (see pack_units); one at a time, in stream order
  // Hybrid sharding: the replica stream's last read of fp32_scratch or the fusion buffer (a
  // sum across replicas of a slot in them, and its cast out). Complete without hybrid sharding.
  Event scratch_read_by_replicas;
  Buffer staging;  // the communicator's staging memory (set_staging_buffer)
  PackedCollectives reduce_packs;
  PackedCollectives gather_packs;
  Buffer norm_sums;          // each unit's sum of squared gradients, all-reduced at step()
  Buffer norm_sums_on_host;  // and their copy, which the host reads
  std::map<float*, Buffer> host_state;     // state_view() copies of device arrays (CUDA only)
  std::map<int, FrozenView> frozen_views;  // state_view() of frozen units, by unit
  std::vector<std::vector<DecayRun>> decay_runs;  // per unit
  std::vector<UnitState> units;
  std::vector<std::vector<Piece>> sub_groups;   // update()'s passes
  std::unique_ptr<OffloadedOptimizer> offload;  // optimizer state on NVMe, if offloaded
  std::unique_ptr<ParamSwap> param_swap;        // stage 3's parameter shards on NVMe, if so
  std::map<int, Buffer> param_copies;           // param_copy()'s shards, by unit
  // offload_optimizer cpu: the last update's copies of parameters to the device, which the
  // host waits for before it writes their host side again.
  std::vector<Event> host_uploads;
  size_t live = 0;  // elements of non-persistent stage-3 units gathered now
  // Communication figures of the step in progress (StepStats). Busy time is added by markers
  // on the communication stream, hence shared with its closures and atomic.
  int collectives_issued = 0;
  double comm_wait_us = 0.0;
  std::shared_ptr<std::atomic<int64_t>> comm_busy_us = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace zero
