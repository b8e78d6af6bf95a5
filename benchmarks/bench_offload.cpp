// One optimizer pass over NVMe-resident state (offload_optimizer device nvme) against the disk
// itself: for each size, the engine's optimizer step on one rank (its StepStats say how long
// the pass took, how long it was blocked on the disk and how many bytes it moved) alternates
// with raw O_DIRECT passes over a file of the same bytes in the same directory: a sequential
// write, then a sequential read, through io_uring with the same block size and as many requests
// in flight as the engine keeps (queue_depth per I/O thread). Both are reported as GB/s of state
// read plus written; ours / raw is how much of the disk's speed the optimizer keeps, and the
// pass's time over the time its own transfers were outstanding (StepStats::nvme_busy_ms) says
// whether its compute hides under the I/O.
//
// The raw pass moves its blocks through as much memory as the engine's staging buffers
// (buffer_count sub-group records): on this virtual machine a transfer into memory that is not
// cache- and TLB-hot costs more than the disk, and 768 MiB landing in 8 MiB of requests in
// flight (the disk's best case, also reported: raw_ring_*) took 400 ms where the same bytes
// through 768 MiB took 580-630 ms, in the same runs. No optimizer pass can land its state in
// a ring of in-flight blocks, so that best case is reported beside, not divided by.
//
//   zero-bench-offload [--path DIR] [--sizes 64M,256M] [--dtype bf16|fp32] [--reps 3]
//                      [--sub-group-size N] [--buffer-count N] [--block-size B]
//                      [--queue-depth N] [--io-threads N] [--pipeline on|off] [--json FILE]
//
// Sizes count parameters (K, M, G: powers of 1024). Start it with zerorun -np 1 (or alone).
#include <fcntl.h>
#include <liburing.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "zero/collectives/communicator.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/nvme_file.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* const kUsage =
    "usage: zero-bench-offload [--path DIR] [--sizes 64M,256M] [--dtype bf16|fp32] [--reps N]\n"
    "                          [--sub-group-size N] [--buffer-count N] [--block-size B]\n"
    "                          [--queue-depth N] [--io-threads N] [--pipeline on|off]\n"
    "                          [--json FILE]\n";

struct Options {
  std::string path = ".";
  std::vector<uint64_t> sizes = {uint64_t{64} << 20};
  zero::DType dtype = zero::DType::kBFloat16;
  int reps = 3;
  size_t sub_group_elements = size_t{16} << 20;
  int buffer_count = 4;
  zero::AioConfig aio;
  // pipeline_read and pipeline_write: the overlap of compute with I/O that the pass measures
  // (DeepSpeed's defaults are off; off, each sub-group is read, stepped, then written in turn).
  bool pipeline = true;
  std::string json;
};

Options parse_options(int argc, char** argv) {
  using zero::driver::integer_flag;
  using zero::driver::text_flag;
  using zero::driver::usage_error;
  Options opt;
  const auto sizes = [&](const std::string& flag, const std::string& value) {
    opt.sizes.clear();
    for (const std::string& item : zero::driver::split_commas(flag, value)) {
      opt.sizes.push_back(zero::driver::parse_bytes(flag, item));
    }
  };
  const auto dtype = [&](const std::string&, const std::string& value) {
    if (value != "bf16" && value != "fp32") usage_error("--dtype must be bf16 or fp32");
    opt.dtype = value == "bf16" ? zero::DType::kBFloat16 : zero::DType::kFloat32;
  };
  const auto sub_group_size = [&](const std::string& flag, const std::string& value) {
    opt.sub_group_elements = zero::driver::parse_bytes(flag, value);
  };
  const auto block_size = [&](const std::string& flag, const std::string& value) {
    opt.aio.block_size = zero::driver::parse_bytes(flag, value);
    if (opt.aio.block_size % 4096 != 0) usage_error("--block-size must be a multiple of 4096");
    // A request's length travels in 32 bits of its completion tag (RawDisk).
    if (opt.aio.block_size > (size_t{1} << 30)) usage_error("--block-size must be at most 1G");
  };
  const auto pipeline = [&](const std::string&, const std::string& value) {
    if (value != "on" && value != "off") usage_error("--pipeline must be on or off");
    opt.pipeline = value == "on";
  };
  zero::driver::parse_flags(argc, argv, kUsage,
                            {{"--path", text_flag(&opt.path)},
                             {"--sizes", sizes},
                             {"--dtype", dtype},
                             {"--reps", integer_flag(&opt.reps, 1, 1000)},
                             {"--sub-group-size", sub_group_size},
                             {"--buffer-count", integer_flag(&opt.buffer_count, 1, 64)},
                             {"--block-size", block_size},
                             {"--queue-depth", integer_flag(&opt.aio.queue_depth, 1, 4096)},
                             {"--io-threads", integer_flag(&opt.aio.intra_op_parallelism, 1, 64)},
                             {"--pipeline", pipeline},
                             {"--json", text_flag(&opt.json)}});
  // The raw pass keeps queue_depth x io_threads requests in one ring (io_uring's limit: 32768
  // entries), each with a block of its own.
  const size_t depth = static_cast<size_t>(opt.aio.queue_depth) * opt.aio.intra_op_parallelism;
  if (depth > 32768) usage_error("--queue-depth x --io-threads must be at most 32768");
  if (depth * opt.aio.block_size > (size_t{4} << 30)) {
    usage_error(
        "--block-size x --queue-depth x --io-threads must be at most 4G (the raw pass's "
        "buffers)");
  }
  return opt;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The disk alone: `bytes` written then read sequentially, O_DIRECT, in block_size requests with
// queue_depth x io_threads in flight on one ring. The file is unlinked once open.
class RawDisk {
 public:
  // Blocks land in `memory_bytes` of memory (at least one block per request in flight), block
  // k at (k x block) modulo that: consecutive requests, in flight together, never share one.
  // The file is unlinked once open.
  RawDisk(const std::string& dir, uint64_t bytes, const zero::AioConfig& aio, uint64_t memory_bytes)
      : bytes_(bytes),
        block_(aio.block_size),
        depth_(static_cast<unsigned>(aio.queue_depth * aio.intra_op_parallelism)),
        memory_(std::max<uint64_t>(memory_bytes / block_, depth_) * block_) {
    const std::string path = dir + "/zero_bench_offload_raw." + std::to_string(::getpid());
    fd_.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    ZERO_CHECK(fd_.fd >= 0, "cannot open '" << path << "' with O_DIRECT: " << std::strerror(errno));
    ZERO_CHECK(::unlink(path.c_str()) == 0,
               "cannot unlink '" << path << "': " << std::strerror(errno));
    const int fallocated = ::posix_fallocate(fd_.fd, 0, static_cast<off_t>(bytes));
    ZERO_CHECK(fallocated == 0, "cannot reserve " << bytes << " bytes for '" << path
                                                  << "': " << std::strerror(fallocated));
    void* memory = nullptr;
    ZERO_CHECK(::posix_memalign(&memory, 4096, memory_) == 0,
               "cannot allocate " << memory_ << " aligned bytes");
    buffer_.reset(static_cast<char*>(memory));
    std::memset(buffer_.get(), 0x5a, memory_);
    const int ring = io_uring_queue_init(depth_, &ring_, 0);
    ZERO_CHECK(ring == 0, "io_uring_queue_init(" << depth_ << "): " << std::strerror(-ring));
  }
  // The ring is made last, so a constructor that throws has none to tear down (the file and the
  // buffer close and free themselves).
  ~RawDisk() { io_uring_queue_exit(&ring_); }
  RawDisk(const RawDisk&) = delete;
  RawDisk& operator=(const RawDisk&) = delete;

  // Seconds for one sequential pass, at most depth requests in flight; `ring`: every block
  // through the first depth blocks of the memory only (the disk's best case).
  double pass(bool write, bool ring) {
    const uint64_t span = ring ? uint64_t{depth_} * block_ : memory_;
    const Clock::time_point start = Clock::now();
    uint64_t next = 0;
    unsigned in_flight = 0;
    while (next < bytes_ || in_flight > 0) {
      while (next < bytes_ && in_flight < depth_) {
        const auto length = static_cast<unsigned>(std::min<uint64_t>(block_, bytes_ - next));
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        ZERO_CHECK(sqe != nullptr, "io_uring submission queue full");
        char* data = buffer_.get() + next % span;
        if (write) {
          io_uring_prep_write(sqe, fd_.fd, data, length, next);
        } else {
          io_uring_prep_read(sqe, fd_.fd, data, length, next);
        }
        io_uring_sqe_set_data64(sqe, length);
        next += length;
        ++in_flight;
      }
      const int submitted = io_uring_submit(&ring_);
      ZERO_CHECK(submitted >= 0, "io_uring_submit: " << std::strerror(-submitted));
      io_uring_cqe* cqe = nullptr;
      const int waited = io_uring_wait_cqe(&ring_, &cqe);
      ZERO_CHECK(waited == 0, "io_uring_wait_cqe: " << std::strerror(-waited));
      const auto expected = static_cast<int>(io_uring_cqe_get_data64(cqe));
      ZERO_CHECK(
          cqe->res == expected,
          (write ? "write" : "read")
              << " of " << expected << " bytes returned " << cqe->res
              << (cqe->res < 0 ? std::string(": ") + std::strerror(-cqe->res) : std::string()));
      --in_flight;
      io_uring_cqe_seen(&ring_, cqe);
    }
    return seconds_since(start);
  }

 private:
  // A file descriptor closed with its owner.
  struct File {
    int fd = -1;
    ~File() {
      if (fd >= 0 && ::close(fd) != 0) {
        std::fprintf(stderr, "zero-bench-offload: close: %s\n", std::strerror(errno));
      }
    }
  };

  uint64_t bytes_;
  size_t block_;
  unsigned depth_;
  uint64_t memory_;
  File fd_;
  std::unique_ptr<char, decltype(&std::free)> buffer_{nullptr, &std::free};
  io_uring ring_{};
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The engine's staging memory for `params` of `dtype` on NVMe: buffer_count slots of the largest
// sub-group record (fp32 master, when the working dtype is not fp32, and Adam's two moments, each
// array aligned), never more than the records there are.
uint64_t staging_bytes(const Options& opt, uint64_t params) {
  const uint64_t sub_group = std::min<uint64_t>(opt.sub_group_elements, params);
  const uint64_t records = (params + sub_group - 1) / sub_group;
  const uint64_t arrays = opt.dtype == zero::DType::kFloat32 ? 2 : 3;
  const uint64_t slot = arrays * zero::nvme_align_up(sub_group * sizeof(float));
  return std::min<uint64_t>(static_cast<uint64_t>(opt.buffer_count), records) * slot;
}

zero::driver::JsonRecord measure(const Options& opt, zero::Communicator& comm, uint64_t params) {
  zero::EngineConfig config;
  config.stage = 1;
  config.precision.dtype = opt.dtype;
  config.optimizer.lr = 1e-4f;
  config.schedule.optimizer_sub_group_elements = opt.sub_group_elements;
  config.offload.optimizer.device = zero::OffloadDevice::kNvme;
  config.offload.optimizer.nvme_path = opt.path;
  config.offload.optimizer.buffer_count = opt.buffer_count;
  config.offload.optimizer.pipeline_read = opt.pipeline;
  config.offload.optimizer.pipeline_write = opt.pipeline;
  config.offload.aio = opt.aio;
  zero::ParamDecl decl;
  decl.spec.name = "weight";
  decl.spec.shape = {static_cast<int64_t>(params)};
  zero::Engine engine(comm, {decl}, config);
  const uint64_t memory = staging_bytes(opt, params);
  RawDisk raw(opt.path, engine.nvme_bytes(), opt.aio, memory);
  // A gradient that changes every element (the pass's arithmetic is the same for any value).
  const size_t grad_bytes = zero::dtype_size(opt.dtype) * params;
  std::memset(engine.grad(0), 0x3c, grad_bytes);

  std::vector<double> ours_s, wait_s, busy_s, over_busy, raw_s, raw_read_s, raw_write_s, ring_s;
  uint64_t moved = 0;
  for (int rep = 0; rep <= opt.reps; ++rep) {  // rep 0 warms all up and is not counted
    const double ring_write_s = raw.pass(true, /*ring=*/true);
    const double ring_read_s = raw.pass(false, /*ring=*/true);
    const double write_s = raw.pass(true, /*ring=*/false);
    const double read_s = raw.pass(false, /*ring=*/false);
    engine.grads_ready(0);
    const zero::StepStats stats = engine.step();
    std::memset(engine.grad(0), 0x3c, grad_bytes);
    if (rep == 0) continue;
    moved = stats.nvme_read_bytes + stats.nvme_write_bytes;
    ours_s.push_back(stats.optimizer_ms / 1000.0);
    wait_s.push_back(stats.nvme_wait_ms / 1000.0);
    busy_s.push_back(stats.nvme_busy_ms / 1000.0);
    over_busy.push_back(stats.optimizer_ms / stats.nvme_busy_ms);
    raw_read_s.push_back(read_s);
    raw_write_s.push_back(write_s);
    raw_s.push_back(read_s + write_s);
    ring_s.push_back(ring_read_s + ring_write_s);
  }
  const double state = static_cast<double>(engine.nvme_bytes());
  zero::driver::JsonRecord record;
  record["params"] = params;
  record["dtype"] = zero::dtype_name(opt.dtype);
  record["pipeline"] = opt.pipeline;
  record["bytes"] = engine.nvme_bytes();
  record["moved_bytes"] = moved;
  record["raw_memory_bytes"] = memory;
  record["ours_ms"] = zero::driver::rounded(median(ours_s) * 1e3, 2);
  record["nvme_wait_ms"] = zero::driver::rounded(median(wait_s) * 1e3, 2);
  record["nvme_busy_ms"] = zero::driver::rounded(median(busy_s) * 1e3, 2);
  record["raw_ms"] = zero::driver::rounded(median(raw_s) * 1e3, 2);
  record["raw_ring_ms"] = zero::driver::rounded(median(ring_s) * 1e3, 2);
  record["ours_GBps"] = zero::driver::rounded(static_cast<double>(moved) / median(ours_s) / 1e9, 3);
  record["raw_GBps"] = zero::driver::rounded(2 * state / median(raw_s) / 1e9, 3);
  record["raw_read_GBps"] = zero::driver::rounded(state / median(raw_read_s) / 1e9, 3);
  record["raw_write_GBps"] = zero::driver::rounded(state / median(raw_write_s) / 1e9, 3);
  record["raw_ring_GBps"] = zero::driver::rounded(2 * state / median(ring_s) / 1e9, 3);
  record["ours_over_raw"] = zero::driver::rounded(
      record["ours_GBps"].get<double>() / record["raw_GBps"].get<double>(), 3);
  record["optimizer_over_io"] = zero::driver::rounded(median(ours_s) / median(raw_s), 3);
  // The pass's wall time over the time its own transfers were outstanding, per step: the
  // compute it did not hide, whatever speed the disk had in that step.
  record["optimizer_over_busy"] = zero::driver::rounded(median(over_busy), 3);
  return record;
}

int run(const Options& opt) {
  std::unique_ptr<zero::Communicator> comm = zero::make_mpi_communicator();
  ZERO_CHECK(comm->world_size() == 1, "zero-bench-offload runs on one rank, got "
                                          << comm->world_size() << " (zerorun -np 1)");
  std::filesystem::create_directories(opt.path);
  std::printf(
      "# zero-bench-offload: %s state, sub-groups of %zu, %d buffers, block %zu B, "
      "depth %d x %d thread(s), pipeline %s, in %s\n",
      zero::dtype_name(opt.dtype), opt.sub_group_elements, opt.buffer_count, opt.aio.block_size,
      opt.aio.queue_depth, opt.aio.intra_op_parallelism, opt.pipeline ? "on" : "off",
      opt.path.c_str());
  std::printf("%12s %12s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "params", "state bytes",
              "ours ms", "wait ms", "busy ms", "ours/busy", "raw ms", "ours GB/s", "raw GB/s",
              "ours/raw", "ring GB/s");
  std::vector<zero::driver::JsonRecord> records;
  for (uint64_t params : opt.sizes) {
    zero::driver::JsonRecord r = measure(opt, *comm, params);
    std::printf("%12llu %12llu %10.1f %10.1f %10.1f %10.3f %10.1f %10.3f %10.3f %10.3f %10.3f\n",
                static_cast<unsigned long long>(params),
                static_cast<unsigned long long>(r["bytes"].get<uint64_t>()),
                r["ours_ms"].get<double>(), r["nvme_wait_ms"].get<double>(),
                r["nvme_busy_ms"].get<double>(), r["optimizer_over_busy"].get<double>(),
                r["raw_ms"].get<double>(), r["ours_GBps"].get<double>(),
                r["raw_GBps"].get<double>(), r["ours_over_raw"].get<double>(),
                r["raw_ring_GBps"].get<double>());
    std::fflush(stdout);
    records.push_back(std::move(r));
  }
  if (!opt.json.empty()) {
    ZERO_CHECK(zero::driver::write_json_array(opt.json, records),
               "cannot write '" << opt.json << "'");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> parsed = zero::driver::parse_command_line(
      "zero-bench-offload", kUsage, [&] { return parse_options(argc, argv); });
  if (!parsed) return 2;
  const Options& opt = *parsed;
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "zero-bench-offload: MPI_Init failed\n");
    return 1;
  }
  int status = 1;
  try {
    status = run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-bench-offload: error: %s\n", e.what());
  }
  if (MPI_Finalize() != MPI_SUCCESS) {
    std::fprintf(stderr, "zero-bench-offload: MPI_Finalize failed\n");
    status = 1;
  }
  return status;
}
