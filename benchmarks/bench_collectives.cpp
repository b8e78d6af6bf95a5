// zero-bench-collectives: our CPU Communicator on its default path (shared memory when every
// rank is on one node), the same forced onto MPI (CpuTransport::kMpi), and the raw MPI calls,
// side by side, on the same buffers, reported the way nccl-tests reports (size, count, type,
// then per backend time, algbw, busbw, #wrong). Run under mpirun:
//
//   mpirun -np 2 zero-bench-collectives -b 16M -e 128M -f 2 -o all
//
// Definitions (as nccl-tests uses them):
//   size     bytes of the whole buffer: for all_gather the gathered output, for reduce_scatter
//            the input; for all_reduce and broadcast the buffer itself.
//   time     mean time per op, the maximum over ranks (the slowest rank sets the pace).
//   algbw    size / time.
//   busbw    algbw times the share of the buffer that crosses each rank's link in a ring:
//            all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1 (the table
//            of zero/collectives/collective_table.h). It is the number to compare against the
//            hardware's bandwidth, whatever n is. For 16-bit reductions both columns send fp32
//            (see below), so the bytes on the wire are twice what size and busbw count.
//   #wrong   elements that differ from the exact result, summed over ranks. Inputs are small
//            integers, so sums are exact in every dtype and every reduction order.
//
// The buffers are in node-shared memory (Communicator::allocate_shared on the default path's
// communicator), as the engine's gradient buckets and gathered parameters are, so "zero" runs
// straight on them; --private-buffers puts them in private memory, where its shared-memory path
// copies through the window's slots instead. MPI takes either alike.
//
// The "zero" and "zero-mpi" backends enqueue ops on their communicator's stream and wait for
// the last; the "mpi" backend makes the same calls directly on the calling thread, on its own
// duplicate of MPI_COMM_WORLD. The three alternate in blocks of iterations (see Bench::measure).
// The last column is zero's busbw over mpi's. MPI cannot sum
// 16-bit floats, so for half/bfloat16 reductions the mpi column is what a program without our
// communicator would write: cast to fp32, the fp32 MPI reduction, cast back, all on the calling
// thread (the same work our worker does). Moving 16-bit data (all_gather, broadcast) is a plain
// MPI_UINT16_T call in both.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "zero/collectives/collective_table.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_kernels.h"

namespace {

using zero::CollectiveOp;
using zero::DType;

// --- command line ----------------------------------------------------------------------------

struct Options {
  size_t min_bytes = 1 << 20;
  size_t max_bytes = 64 << 20;
  size_t factor = 2;
  std::vector<CollectiveOp> ops{CollectiveOp::kAllReduce};
  DType dtype = DType::kFloat32;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  bool private_buffers = false;
  std::string json_path;
};

const char* kUsage =
    "usage: zero-bench-collectives [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-o OP] [-d DTYPE]\n"
    "                              [-n ITERS] [-w WARMUP] [-c 0|1] [--private-buffers]\n"
    "                              [--json FILE]\n"
    "  -b, -e   smallest and largest size in bytes; K, M, G suffixes are powers of 1024\n"
    "           (default 1M to 64M)\n"
    "  -f       multiply the size by this integer >= 2 each step (default 2)\n"
    "  -o       all_gather, reduce_scatter, all_reduce, broadcast, or all (default all_reduce)\n"
    "  -d       float, half, bfloat16 (also fp32, fp16, bf16; default float)\n"
    "  -n, -w   timed and warm-up iterations per size (default 20 and 5)\n"
    "  -c       check results (default 1)\n"
    "  --private-buffers  buffers in private memory, not node-shared (zero then stages)\n"
    "  --json   also write every measurement to FILE as one JSON array\n";

// Parses a non-negative integer with an optional K/M/G suffix (powers of 1024).
bool parse_bytes(const std::string& text, size_t* out) {
  std::string digits = text;
  const uint64_t unit = zero::driver::strip_byte_suffix(&digits);
  long value = 0;
  if (text.empty() || text[0] == '-' || !zero::driver::parse_integer(digits, &value)) {
    return false;
  }
  if (static_cast<uint64_t>(value) > SIZE_MAX / unit) return false;
  *out = static_cast<size_t>(static_cast<uint64_t>(value) * unit);
  return true;
}

bool parse_int(const std::string& text, int min, int* out) {
  long value = 0;
  if (!zero::driver::parse_integer(text, &value) || value < min || value > INT_MAX) return false;
  *out = static_cast<int>(value);
  return true;
}

bool parse_ops(const std::string& text, std::vector<CollectiveOp>* out) {
  const CollectiveOp all[] = {CollectiveOp::kAllGather, CollectiveOp::kReduceScatter,
                              CollectiveOp::kAllReduce, CollectiveOp::kBroadcast};
  if (text == "all") {
    out->assign(std::begin(all), std::end(all));
    return true;
  }
  for (CollectiveOp op : all) {
    if (text == zero::collective_op_name(op)) {
      out->assign(1, op);
      return true;
    }
  }
  return false;
}

// Returns an empty string on success, "help" for -h/--help, else what is wrong.
std::string parse_options(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") return "help";
    if (flag == "--private-buffers") {
      opt->private_buffers = true;
      continue;
    }
    if (i + 1 >= argc) return "missing value after " + flag;
    const std::string value = argv[++i];
    bool ok = true;
    if (flag == "-b") {
      ok = parse_bytes(value, &opt->min_bytes);
    } else if (flag == "-e") {
      ok = parse_bytes(value, &opt->max_bytes);
    } else if (flag == "-f") {
      int factor = 0;
      ok = parse_int(value, 2, &factor);
      opt->factor = static_cast<size_t>(factor);
    } else if (flag == "-o") {
      ok = parse_ops(value, &opt->ops);
    } else if (flag == "-d") {
      ok = zero::parse_dtype(value, &opt->dtype);
    } else if (flag == "-n") {
      ok = parse_int(value, 1, &opt->iters);
    } else if (flag == "-w") {
      ok = parse_int(value, 0, &opt->warmup);
    } else if (flag == "-c") {
      int check = 0;
      ok = (value == "0" || value == "1") && parse_int(value, 0, &check);
      opt->check = check == 1;
    } else if (flag == "--json") {
      opt->json_path = value;
    } else {
      return "unknown flag " + flag;
    }
    if (!ok) return "bad value '" + value + "' for " + flag;
  }
  if (opt->min_bytes == 0) return "-b must be at least 1 byte";
  if (opt->min_bytes > opt->max_bytes) return "-b is larger than -e";
  return "";
}

// --- one measurement -------------------------------------------------------------------------

// Element i of rank r's input: an integer in [-4, 4], so every sum is exact.
float value(int rank, size_t i) {
  return static_cast<float>((rank * 5 + i * 3) % 9) - 4.0f;
}

// nccl-tests' bus factor is the share of the buffer each rank sends: the table the
// communicator's byte counters use.
double bus_factor(CollectiveOp op, int n) {
  return zero::ring_share(op, n).factor();
}

// The timed iterations of each backend are split into this many blocks, alternating.
constexpr int kTimingBlocks = 4;

struct Result {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  uint64_t wrong = 0;
  bool checked = false;
};

struct Record {
  CollectiveOp op;
  const char* backend;
  size_t bytes;
  Result result;
};

// The columns, in order: our default path, ours forced onto MPI, raw MPI.
constexpr int kBackends = 3;
constexpr int kRawMpi = 2;
const char* const kBackendNames[kBackends] = {"zero", "zero-mpi", "mpi"};

class Bench {
 public:
  // comms: ours on the default path, then forced onto MPI.
  Bench(const Options& opt, std::array<zero::Communicator*, 2> comms) : opt_(opt), comms_(comms) {
    rank_ = comms[0]->rank();
    n_ = comms[0]->world_size();
    ZERO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm_));
    // The largest op's two buffers: an all-reduce of max_bytes, out of place; a page each for
    // alignment.
    shared_ = !opt.private_buffers && comms[0]->reserve_shared(2 * opt.max_bytes + 2 * 4096);
  }
  ~Bench() {
    release();
    MPI_Comm_free(&raw_comm_);
  }

  // Count argument of the op for a size in bytes (per rank for all_gather/reduce_scatter).
  size_t count_for(CollectiveOp op, size_t bytes) const {
    const size_t per = zero::dtype_size(opt_.dtype) * (sharded(op) ? n_ : 1);
    return bytes / per;
  }
  size_t bytes_for(CollectiveOp op, size_t count) const {
    return count * zero::dtype_size(opt_.dtype) * (sharded(op) ? n_ : 1);
  }

  // Whether the buffers are in node-shared memory (false: there is none on this path, or
  // --private-buffers).
  bool shared_buffers() const { return shared_; }

  void allocate(CollectiveOp op, size_t max_count) {
    const size_t elem = zero::dtype_size(opt_.dtype);
    release();
    send_ = place(send_elems(op, max_count) * elem, &private_send_);
    recv_ = place(recv_elems(op, max_count) * elem, &private_recv_);
    if (opt_.dtype != DType::kFloat32) staged_.assign(send_elems(op, max_count), 0.0f);
  }

  // Times every backend on one size, in kBackendNames' order. The timed iterations alternate
  // between the backends in blocks, so a burst of load from other processes on a shared
  // machine lands on all alike instead of on whichever ran during it.
  std::array<Result, kBackends> measure(CollectiveOp op, size_t count) {
    fill_inputs(op, count);  // also touches every page before timing
    for (int backend = 0; backend < kBackends; ++backend) {
      for (int i = 0; i < opt_.warmup; ++i) run(op, count, backend);
    }
    double seconds[kBackends] = {};
    const int block = (opt_.iters + kTimingBlocks - 1) / kTimingBlocks;
    for (int first = 0; first < opt_.iters; first += block) {
      const int iters = std::min(block, opt_.iters - first);
      for (int backend = 0; backend < kBackends; ++backend) {
        seconds[backend] += time_block(op, count, backend, iters);
      }
    }
    ZERO_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, seconds, kBackends, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));

    std::array<Result, kBackends> results;
    for (int backend = 0; backend < kBackends; ++backend) {
      Result& r = results[backend];
      const double per_op = seconds[backend] / opt_.iters;
      r.time_us = per_op * 1e6;
      r.algbw = static_cast<double>(bytes_for(op, count)) / per_op / 1e9;
      r.busbw = r.algbw * bus_factor(op, n_);
      if (opt_.check) {
        fill_inputs(op, count);
        run(op, count, backend);
        r.wrong = count_wrong(op, count);
        r.checked = true;
      }
    }
    return results;
  }

 private:
  static bool sharded(CollectiveOp op) {
    return op == CollectiveOp::kAllGather || op == CollectiveOp::kReduceScatter;
  }
  size_t send_elems(CollectiveOp op, size_t count) const {
    return op == CollectiveOp::kReduceScatter ? count * n_ : count;
  }
  size_t recv_elems(CollectiveOp op, size_t count) const {
    if (op == CollectiveOp::kBroadcast) return 0;  // in place in the send buffer
    return op == CollectiveOp::kAllGather ? count * n_ : count;
  }
  void* output() { return recv_ == nullptr ? send_ : recv_; }

  // Both buffers given back, so that the next op's fit in what was reserved.
  void release() {
    for (unsigned char* data : {send_, recv_}) {
      if (shared_ && data != nullptr) comms_[0]->free_shared(data);
    }
    send_ = recv_ = nullptr;
    private_send_.clear();
    private_recv_.clear();
  }

  // `bytes` zeroed bytes in node-shared memory when the buffers are shared, else in `fallback`;
  // null for none.
  unsigned char* place(size_t bytes, std::vector<unsigned char>* fallback) {
    if (bytes == 0) return nullptr;
    if (shared_) {
      auto* data = static_cast<unsigned char*>(comms_[0]->allocate_shared(bytes));
      ZERO_CHECK(data != nullptr, "no node-shared memory left for " << bytes << " bytes");
      return data;
    }
    fallback->assign(bytes, 0);
    return fallback->data();
  }

  // Inputs are this rank's values; the output starts as a value no result can have.
  void fill_inputs(CollectiveOp op, size_t count) {
    for (size_t i = 0; i < send_elems(op, count); ++i) {
      zero::store_from_float(send_, opt_.dtype, i, value(rank_, i));
    }
    for (size_t i = 0; i < recv_elems(op, count); ++i) {
      zero::store_from_float(recv_, opt_.dtype, i, 100.0f);
    }
  }

  // Seconds this rank spends on `iters` back-to-back ops, started together on all ranks. Ours
  // are all enqueued at once and only the last is waited for, as the engine uses them.
  double time_block(CollectiveOp op, size_t count, int backend, int iters) {
    ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const double start = MPI_Wtime();
    if (backend != kRawMpi) {
      zero::Event last;
      for (int i = 0; i < iters; ++i) last = issue(*comms_[backend], op, count);
      last.wait();
    } else {
      for (int i = 0; i < iters; ++i) raw(op, count);
    }
    return MPI_Wtime() - start;
  }

  void run(CollectiveOp op, size_t count, int backend) {
    if (backend != kRawMpi) {
      issue(*comms_[backend], op, count).wait();
    } else {
      raw(op, count);
    }
  }

  zero::Event issue(zero::Communicator& comm, CollectiveOp op, size_t count) {
    switch (op) {
      case CollectiveOp::kAllGather:
        return comm.all_gather(send_, recv_, count, opt_.dtype);
      case CollectiveOp::kReduceScatter:
        return comm.reduce_scatter(send_, recv_, count, opt_.dtype);
      case CollectiveOp::kAllReduce:
        return comm.all_reduce(send_, recv_, count, opt_.dtype);
      case CollectiveOp::kBroadcast:
        return comm.broadcast(send_, count, opt_.dtype, 0);
      case CollectiveOp::kBarrier:
        break;
      case CollectiveOp::kAllToAll:
        ZERO_FAIL("this benchmark does not run all_to_all (its flags cannot name it)");
    }
    return comm.barrier();
  }

  // The same collective as plain MPI on the calling thread (see the file comment for 16-bit
  // reductions).
  void raw(CollectiveOp op, size_t count) {
    const int c = static_cast<int>(count);
    const bool fp32 = opt_.dtype == DType::kFloat32;
    const MPI_Datatype moved = fp32 ? MPI_FLOAT : MPI_UINT16_T;
    switch (op) {
      case CollectiveOp::kAllGather:
        ZERO_MPI_CHECK(MPI_Allgather(send_, c, moved, recv_, c, moved, raw_comm_));
        return;
      case CollectiveOp::kBroadcast:
        ZERO_MPI_CHECK(MPI_Bcast(send_, c, moved, 0, raw_comm_));
        return;
      case CollectiveOp::kReduceScatter:
        if (fp32) {
          ZERO_MPI_CHECK(MPI_Reduce_scatter_block(send_, recv_, c, MPI_FLOAT, MPI_SUM, raw_comm_));
        } else {
          zero::kernels::cast(send_, opt_.dtype, staged_.data(), DType::kFloat32, count * n_);
          ZERO_MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, staged_.data(), c, MPI_FLOAT,
                                                  MPI_SUM, raw_comm_));
          zero::kernels::cast(staged_.data(), DType::kFloat32, recv_, opt_.dtype, count);
        }
        return;
      case CollectiveOp::kAllReduce:
        if (fp32) {
          ZERO_MPI_CHECK(MPI_Allreduce(send_, recv_, c, MPI_FLOAT, MPI_SUM, raw_comm_));
        } else {
          zero::kernels::cast(send_, opt_.dtype, staged_.data(), DType::kFloat32, count);
          ZERO_MPI_CHECK(
              MPI_Allreduce(MPI_IN_PLACE, staged_.data(), c, MPI_FLOAT, MPI_SUM, raw_comm_));
          zero::kernels::cast(staged_.data(), DType::kFloat32, recv_, opt_.dtype, count);
        }
        return;
      case CollectiveOp::kBarrier:
        break;
      case CollectiveOp::kAllToAll:
        ZERO_FAIL("this benchmark does not run all_to_all (its flags cannot name it)");
    }
    ZERO_MPI_CHECK(MPI_Barrier(raw_comm_));
  }

  // Exact expected output element i, summed over ranks in fp32 and rounded once to the dtype.
  float expected(CollectiveOp op, size_t count, size_t i) const {
    float v = 0;
    switch (op) {
      case CollectiveOp::kAllGather:
        v = value(static_cast<int>(i / count), i % count);
        break;
      case CollectiveOp::kBroadcast:
        v = value(0, i);
        break;
      case CollectiveOp::kReduceScatter:
        for (int r = 0; r < n_; ++r) v += value(r, rank_ * count + i);
        break;
      case CollectiveOp::kAllReduce:
        for (int r = 0; r < n_; ++r) v += value(r, i);
        break;
      case CollectiveOp::kBarrier:
        break;
      case CollectiveOp::kAllToAll:
        ZERO_FAIL("this benchmark does not run all_to_all (its flags cannot name it)");
    }
    return v;
  }

  uint64_t count_wrong(CollectiveOp op, size_t count) {
    const size_t out_elems = op == CollectiveOp::kBroadcast ? count : recv_elems(op, count);
    const void* out = output();
    uint64_t wrong = 0;
    for (size_t i = 0; i < out_elems; ++i) {
      if (zero::load_as_float(out, opt_.dtype, i) != expected(op, count, i)) ++wrong;
    }
    ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
    return wrong;
  }

  const Options& opt_;
  std::array<zero::Communicator*, 2> comms_;
  MPI_Comm raw_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int n_ = 1;
  bool shared_ = false;
  unsigned char* send_ = nullptr;
  unsigned char* recv_ = nullptr;
  std::vector<unsigned char> private_send_, private_recv_;  // without node-shared memory
  std::vector<float> staged_;  // fp32 copy for the raw 16-bit reductions
};

// --- report ----------------------------------------------------------------------------------

void print_header(const Options& opt, int n, bool shared_buffers) {
  std::printf("# zero-bench-collectives: %d ranks, dtype %s, iters %d, warmup %d, check %s\n", n,
              zero::dtype_name(opt.dtype), opt.iters, opt.warmup, opt.check ? "on" : "off");
  std::printf("# buffers: %s\n", shared_buffers
                                     ? "node-shared memory (zero runs straight on them)"
                                     : "private memory (zero's shared-memory path stages)");
  std::printf("# time: mean per op, max over ranks. algbw = size/time. busbw = algbw * factor.\n");
  if (opt.dtype != DType::kFloat32) {
    std::printf(
        "# mpi column for 16-bit reductions: cast to fp32 + fp32 MPI call + cast back on "
        "the calling thread (MPI has no 16-bit float sum); both columns send fp32, twice the "
        "bytes that size and busbw count\n");
  }
}

void print_op_header(CollectiveOp op, int n) {
  std::printf("#\n# %s, busbw factor %.3f\n", zero::collective_op_name(op), bus_factor(op, n));
  std::printf("# %36s", "");
  for (const char* name : kBackendNames) std::printf(" %-38s", name);
  std::printf(" %s\n", "busbw");
  std::printf("# %10s %12s %6s", "size(B)", "count", "type");
  for (int b = 0; b < kBackends; ++b) {
    std::printf("   %9s %8s %8s %8s", "time(us)", "algbw", "busbw", "#wrong");
  }
  std::printf("   %s\n", "zero/mpi");
}

void print_result(const Result& r) {
  std::printf("   %9.1f %8.2f %8.2f", r.time_us, r.algbw, r.busbw);
  if (r.checked) {
    std::printf(" %8llu", static_cast<unsigned long long>(r.wrong));
  } else {
    std::printf(" %8s", "N/A");
  }
}

bool write_json(const std::string& path, const std::vector<Record>& records, DType dtype) {
  using zero::driver::rounded;
  std::vector<zero::driver::JsonRecord> json;
  for (const Record& rec : records) {
    json.push_back({{"op", zero::collective_op_name(rec.op)},
                    {"backend", rec.backend},
                    {"dtype", zero::dtype_name(dtype)},
                    {"bytes", rec.bytes},
                    {"time_us", rounded(rec.result.time_us, 3)},
                    {"algbw_GBps", rounded(rec.result.algbw, 4)},
                    {"busbw_GBps", rounded(rec.result.busbw, 4)},
                    {"wrong", rec.result.checked ? zero::driver::JsonRecord(rec.result.wrong)
                                                 : zero::driver::JsonRecord()}});
  }
  return zero::driver::write_json_array(path, json);
}

// min, min*f, min*f^2, ... up to max (never overflowing).
std::vector<size_t> sizes_to_run(const Options& opt) {
  std::vector<size_t> sizes;
  for (size_t bytes = opt.min_bytes;; bytes *= opt.factor) {
    sizes.push_back(bytes);
    if (bytes > opt.max_bytes / opt.factor) break;
  }
  return sizes;
}

int run_bench(const Options& opt, int rank, int n) {
  auto comm = zero::make_mpi_communicator();
  auto over_mpi =
      zero::make_mpi_communicator(static_cast<size_t>(INT_MAX), zero::CpuTransport::kMpi);
  Bench bench(opt, {comm.get(), over_mpi.get()});
  std::vector<Record> records;
  uint64_t total_wrong = 0;
  if (rank == 0) print_header(opt, n, bench.shared_buffers());
  for (CollectiveOp op : opt.ops) {
    if (bench.count_for(op, opt.max_bytes) > static_cast<size_t>(INT_MAX)) {
      if (rank == 0) {
        std::fprintf(stderr, "zero-bench-collectives: -e %zu is too large for one raw MPI call\n",
                     opt.max_bytes);
      }
      return 2;
    }
    bench.allocate(op, bench.count_for(op, opt.max_bytes));
    if (rank == 0) print_op_header(op, n);
    double busbw_sum[kBackends] = {};
    int sizes = 0;
    for (size_t bytes : sizes_to_run(opt)) {
      const size_t count = bench.count_for(op, bytes);
      if (count == 0) continue;  // less than one element per rank
      const std::array<Result, kBackends> all = bench.measure(op, count);
      const size_t size = bench.bytes_for(op, count);
      for (int b = 0; b < kBackends; ++b) {
        records.push_back({op, kBackendNames[b], size, all[b]});
        total_wrong += all[b].wrong;
        busbw_sum[b] += all[b].busbw;
      }
      ++sizes;
      if (rank == 0) {
        std::printf("  %10zu %12zu %6s", size, size / zero::dtype_size(opt.dtype),
                    zero::dtype_name(opt.dtype));
        for (const Result& r : all) print_result(r);
        const double raw = all[kRawMpi].busbw;
        std::printf("   %8.3f\n", raw > 0 ? all[0].busbw / raw : 0.0);
        std::fflush(stdout);
      }
    }
    if (rank == 0 && sizes > 0) {
      std::printf("# %s avg busbw:", zero::collective_op_name(op));
      for (int b = 0; b < kBackends; ++b) {
        std::printf(" %s %.3f GB/s,", kBackendNames[b], busbw_sum[b] / sizes);
      }
      const double raw = busbw_sum[kRawMpi];
      std::printf(" zero/mpi %.3f\n", raw > 0 ? busbw_sum[0] / raw : 0.0);
    }
  }
  if (rank == 0) {
    std::printf("# total #wrong: %llu\n", static_cast<unsigned long long>(total_wrong));
    if (!opt.json_path.empty() && !write_json(opt.json_path, records, opt.dtype)) {
      std::fprintf(stderr, "zero-bench-collectives: cannot write %s: %s\n", opt.json_path.c_str(),
                   std::strerror(errno));
      return 1;
    }
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  const int rank = mpi.world_rank();
  Options opt;
  // Every rank parses the same command line, so they all agree on whether it is bad.
  const std::string error = parse_options(argc, argv, &opt);
  if (error == "help") {
    if (rank == 0) std::printf("%s", kUsage);
    return 0;
  }
  if (!error.empty()) {
    if (rank == 0) std::fprintf(stderr, "zero-bench-collectives: %s\n%s", error.c_str(), kUsage);
    return 2;
  }
  try {
    return run_bench(opt, rank, mpi.world_size());
  } catch (const std::exception& e) {
    // Other ranks may be inside a collective this rank will never join: end the whole job.
    std::fprintf(stderr, "zero-bench-collectives: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
