#include "zero/runtime/nvme_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "zero/core/check.h"
#include "zero/runtime/memory.h"

namespace zero {

struct NvmeFile::Transfer {
  int remaining = 0;  // requests not yet completed; under done_mutex_
  std::string error;  // the first failure, with where it was seen
};

namespace {

// One request of at most aio.block_size bytes; `done` counts what completed (a short transfer
// is continued from there).
struct Request {
  NvmeFile::Ticket transfer;
  bool write = false;
  char* buffer = nullptr;
  uint64_t offset = 0;
  size_t bytes = 0;
  size_t done = 0;
  bool inject_eio = false;
  // The injected slow disk (tests): the request completes no sooner than this.
  std::chrono::steady_clock::time_point complete_after{};
};

std::string errno_text(int error) {
  std::ostringstream out;
  out << std::strerror(error) << " (errno " << error << ")";
  return out.str();
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

std::string located(const std::string& message, const char* file, int line) {
  std::ostringstream out;
  out << message << " (" << file << ":" << line << ")";
  return out.str();
}

}  // namespace

void check_free_space(const std::string& dir, uint64_t bytes, const std::string& what) {
  struct statvfs fs {};
  ZERO_CHECK(::statvfs(dir.c_str(), &fs) == 0,
             "cannot check the free space of nvme_path " << dir << ": " << errno_text(errno));
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  ZERO_CHECK(free_bytes >= bytes, "nvme_path " << dir << " has " << free_bytes << " bytes ("
                                               << human_bytes(free_bytes) << ") free, but " << what
                                               << " needs " << bytes << " bytes ("
                                               << human_bytes(bytes) << ")");
}

int create_scratch_file(const std::string& path, int flags, bool allow_unnamed) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const int open_flags = O_RDWR | O_CLOEXEC | flags;
  if (allow_unnamed) {
    const int fd = ::open(dir.c_str(), O_TMPFILE | open_flags, 0600);
    // EOPNOTSUPP: the file system has no O_TMPFILE; EISDIR: the kernel has none. Any other
    // error (EINVAL: no O_DIRECT) would be the named file's too.
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR)) return fd;
  }
  // O_EXCL refuses any name that exists, a symbolic link included; O_NOFOLLOW says so twice.
  std::string name = path + ".XXXXXX";
  const int fd = ::mkostemp(name.data(), open_flags | O_NOFOLLOW);
  if (fd < 0) return fd;
  if (::unlink(name.c_str()) != 0) {
    const int unlink_errno = errno;
    ::close(fd);
    errno = unlink_errno;
    return -1;
  }
  return fd;
}

void check_nvme_directory(const std::string& dir, uint64_t bytes, const std::string& what) {
  // O_DIRECT at open is where a file system without direct I/O refuses, as NvmeFile's would;
  // made as NvmeFile makes its file, the probe has no name to meet another's.
  const int fd = create_scratch_file(dir + "/.zero_nvme_probe", O_DIRECT);
  ZERO_CHECK(fd >= 0, "nvme_path "
                          << dir << " cannot take " << what
                          << ": creating a file in it (O_DIRECT) failed: " << errno_text(errno));
  ::close(fd);
  check_free_space(dir, bytes, what);
}

struct NvmeFile::Worker {
  Worker(NvmeFile& owner, int depth) : file(owner) {
    const int error = io_uring_queue_init(static_cast<unsigned>(depth), &ring, 0);
    ZERO_CHECK(error == 0, "cannot set up io_uring (queue depth " << depth << ") for " << file.path_
                                                                  << ": " << errno_text(-error));
    thread = std::thread([this] { run(); });
  }

  ~Worker() {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_one();
    thread.join();
    io_uring_queue_exit(&ring);
  }

  void push(Request request) {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(std::move(request));
    }
    wake.notify_one();
  }

  // Completes `r` (fully done or failed) on the file's accounting.
  void complete(Request* r, const std::string& error) {
    file.finish(*r->transfer, error);
    in_flight.erase(r);
    delete r;
  }

  std::string describe(const Request& r) const {
    std::ostringstream out;
    out << "nvme: " << (r.write ? "write" : "read") << " of " << file.path_ << " at offset "
        << r.offset + r.done << " (" << r.bytes - r.done << " bytes) failed: ";
    return out.str();
  }

  // Takes requests while the ring has room: as others complete with overlap_events, else
  // only once the whole previous batch completed.
  std::vector<Request*> take() {
    std::unique_lock<std::mutex> lock(mutex);
    if (in_flight.empty()) wake.wait(lock, [&] { return stop || !queue.empty(); });
    std::vector<Request*> batch;
    if (!file.aio_.overlap_events && !in_flight.empty()) return batch;
    while (!queue.empty() &&
           in_flight.size() + batch.size() < static_cast<size_t>(file.aio_.queue_depth)) {
      batch.push_back(new Request(std::move(queue.front())));
      queue.pop_front();
    }
    return batch;
  }

  void submit(std::vector<Request*>& batch) {
    for (Request* r : batch) {
      in_flight.insert(r);
      if (!ring_error.empty()) {
        complete(r, located(describe(*r) + ring_error, __FILE__, __LINE__));
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) {
        complete(r,
                 located(describe(*r) + "no free io_uring submission entry", __FILE__, __LINE__));
        continue;
      }
      const unsigned length = static_cast<unsigned>(r->bytes - r->done);
      if (r->write) {
        io_uring_prep_write(sqe, file.fd_, r->buffer + r->done, length, r->offset + r->done);
      } else {
        io_uring_prep_read(sqe, file.fd_, r->buffer + r->done, length, r->offset + r->done);
      }
      io_uring_sqe_set_data(sqe, r);
      unsubmitted.push_back(r);
      if (file.aio_.single_submit) submit_unsubmitted();
    }
    submit_unsubmitted();
  }

  // Hands the kernel every prepared entry. It may take only some (the rest stay in the ring for
  // the next submission), so this goes on until all are taken, reaping a completion first when
  // the kernel took none while others are in flight (EAGAIN, EBUSY: it waits for room). An
  // error fails what it did not take; their entries stay in the ring, which is not submitted
  // again (each would carry a request already completed), and later requests fail naming it.
  void submit_unsubmitted() {
    while (!unsubmitted.empty() && ring_error.empty()) {
      const int taken = submit_to_kernel(unsubmitted.size());
      if (taken > 0) {
        unsubmitted.erase(unsubmitted.begin(),
                          unsubmitted.begin() + std::min<size_t>(taken, unsubmitted.size()));
        continue;
      }
      if (taken == -EINTR) continue;
      const bool others_in_kernel = in_flight.size() > unsubmitted.size();
      if ((taken == 0 || taken == -EAGAIN || taken == -EBUSY) && others_in_kernel) {
        reap();
        continue;
      }
      const std::string reason =
          taken == 0 ? "it took none of " + std::to_string(unsubmitted.size()) + " entries"
                     : errno_text(-taken) +
                           (injected_failure ? " [injected by ZERO_TEST_NVME_FAULT]" : "");
      ring_error = "an earlier io_uring_submit of this file failed: " + reason;
      const std::deque<Request*> failed = std::exchange(unsubmitted, {});
      for (Request* r : failed) {
        complete(r, located(describe(*r) + "io_uring_submit: " + reason, __FILE__, __LINE__));
      }
    }
  }

  // io_uring_submit, or the injected fault of this submission (tests): EIO, or the kernel
  // taking only the first of `pending` entries (the others hidden from this submission).
  int submit_to_kernel(size_t pending) {
    const int fault = file.injected_submit_fault();
    injected_failure = fault == kSubmitFails;
    if (injected_failure) return -EIO;
    if (fault != kSubmitShort || pending < 2) return io_uring_submit(&ring);
    const unsigned hidden =
        std::min<unsigned>(static_cast<unsigned>(pending - 1), ring.sq.sqe_tail - ring.sq.sqe_head);
    ring.sq.sqe_tail -= hidden;
    const int taken = io_uring_submit(&ring);
    ring.sq.sqe_tail += hidden;
    return taken;
  }

  void reap() {
    io_uring_cqe* cqe = nullptr;
    int error = 0;
    do {
      error = io_uring_wait_cqe(&ring, &cqe);
    } while (error == -EINTR);
    if (error < 0) {
      // The ring itself failed: no completion can be matched to a request, so all fail, and
      // the ring is not used again.
      ring_error = "an earlier io_uring_wait_cqe of this file failed: " + errno_text(-error);
      unsubmitted.clear();
      const std::unordered_set<Request*> failed = in_flight;
      for (Request* r : failed) {
        complete(r, located(describe(*r) + "io_uring_wait_cqe: " + errno_text(-error), __FILE__,
                            __LINE__));
      }
      return;
    }
    auto* r = static_cast<Request*>(io_uring_cqe_get_data(cqe));
    int result = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    if (r->inject_eio) result = -EIO;
    if (result < 0) {
      complete(r, located(describe(*r) + errno_text(-result) +
                              (r->inject_eio ? " [injected by ZERO_TEST_NVME_FAULT]" : ""),
                          __FILE__, __LINE__));
      return;
    }
    if (result == 0) {
      complete(r, located(describe(*r) + "the transfer moved no bytes (past the end of the file)",
                          __FILE__, __LINE__));
      return;
    }
    r->done += static_cast<size_t>(result);
    if (r->done == r->bytes) {
      std::this_thread::sleep_until(r->complete_after);
      complete(r, "");
      return;
    }
    // A short transfer: the rest goes again as its own submission.
    in_flight.erase(r);
    std::vector<Request*> rest = {r};
    submit(rest);
  }

  void run() {
    for (;;) {
      std::vector<Request*> batch = take();
      if (batch.empty() && in_flight.empty()) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (stop && queue.empty()) return;
        continue;
      }
      submit(batch);
      if (!in_flight.empty()) reap();
    }
  }

  NvmeFile& file;
  io_uring ring{};
  std::thread thread;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Request> queue;
  bool stop = false;
  std::unordered_set<Request*> in_flight;  // this thread's only
  // Of in_flight, those prepared in the ring and not yet taken by the kernel, in ring order.
  std::deque<Request*> unsubmitted;
  // Set when a submission failed: the ring still holds entries of completed requests.
  std::string ring_error;
  bool injected_failure = false;
};

NvmeFile::NvmeFile(const std::string& path, uint64_t bytes, const AioConfig& aio, int rank)
    : path_(path), bytes_(bytes), aio_(aio) {
  ZERO_CHECK(bytes % kNvmeAlignment == 0 && aio.block_size % kNvmeAlignment == 0,
             "nvme: " << path << ": sizes must be multiples of " << kNvmeAlignment);
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  fd_ = create_scratch_file(path, O_DIRECT);
  ZERO_CHECK(fd_ >= 0, "nvme: cannot create the offload file "
                           << path << " (O_DIRECT): " << errno_text(errno));
  try {
    check_free_space(dir, bytes, "rank " + std::to_string(rank) + "'s offload file " + path);
    if (bytes > 0) {
      const int error = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
      ZERO_CHECK(error == 0, "nvme: cannot reserve " << bytes << " bytes for " << path
                                                     << " at offset 0: " << errno_text(error));
    }
    if (const char* fault = std::getenv("ZERO_TEST_NVME_FAULT"); fault != nullptr && *fault) {
      const std::string text = fault;
      const size_t at = text.find('@');
      const size_t hash = text.find('#');
      const std::string kind = text.substr(0, at);
      ZERO_CHECK(at != std::string::npos &&
                     (kind == "read" || kind == "write" || kind == "submit" ||
                      kind == "short-submit" || (kind == "slow-read" && hash != std::string::npos)),
                 "ZERO_TEST_NVME_FAULT must be read@RANK[#N], write@RANK[#N], submit@RANK[#N], "
                 "short-submit@RANK[#N] or slow-read@RANK#MS, got '"
                     << text << "'");
      if (std::atoi(text.c_str() + at + 1) == rank) {
        // #N: which transfer or submission fails, or a slow read's milliseconds.
        const long number = hash == std::string::npos ? 1 : std::atol(text.c_str() + hash + 1);
        if (kind == "slow-read") {
          read_delay_ = std::chrono::milliseconds(number);
        } else if (kind == "read" || kind == "write") {
          fault_kind_ = kind == "write" ? 1 : 0;
          fault_countdown_ = number;
        } else {
          submit_fault_ = kind == "submit" ? kSubmitFails : kSubmitShort;
          submit_countdown_ = number;
        }
      }
    }
    for (int i = 0; i < aio.intra_op_parallelism; ++i) {
      workers_.push_back(std::make_unique<Worker>(*this, aio.queue_depth));
    }
  } catch (...) {
    workers_.clear();
    ::close(fd_);
    throw;
  }
}

NvmeFile::~NvmeFile() {
  workers_.clear();
  ::close(fd_);
}

NvmeFile::Ticket NvmeFile::read(void* buffer, uint64_t offset, size_t bytes) {
  return start(false, static_cast<char*>(buffer), offset, bytes);
}

NvmeFile::Ticket NvmeFile::write(const void* buffer, uint64_t offset, size_t bytes) {
  // io_uring's write takes a non-const pointer; the buffer is only read.
  return start(true, static_cast<char*>(const_cast<void*>(buffer)), offset, bytes);
}

NvmeFile::Ticket NvmeFile::start(bool write, char* buffer, uint64_t offset, size_t bytes) {
  ZERO_CHECK(offset % kNvmeAlignment == 0 && bytes % kNvmeAlignment == 0 &&
                 reinterpret_cast<uintptr_t>(buffer) % kNvmeAlignment == 0,
             "nvme: unaligned " << (write ? "write" : "read") << " of " << path_ << " at offset "
                                << offset << " (" << bytes << " bytes)");
  ZERO_CHECK(offset + bytes <= bytes_, "nvme: " << (write ? "write" : "read") << " of " << path_
                                                << " at offset " << offset << " (" << bytes
                                                << " bytes) past its " << bytes_ << " bytes");
  auto ticket = std::make_shared<Transfer>();
  if (bytes == 0) return ticket;
  bool inject = false;
  if (fault_kind_ == (write ? 1 : 0) && fault_countdown_ > 0) inject = --fault_countdown_ == 0;
  const auto complete_after =
      std::chrono::steady_clock::now() + (write ? std::chrono::milliseconds(0) : read_delay_);
  const size_t block = aio_.block_size;
  const size_t requests = (bytes + block - 1) / block;
  ticket->remaining = static_cast<int>(requests);
  {
    // Counted before any request reaches a worker, so no completion can come first.
    const std::lock_guard<std::mutex> lock(done_mutex_);
    if (outstanding_ == 0) busy_since_ = std::chrono::steady_clock::now();
    outstanding_ += requests;
  }
  const size_t threads = workers_.size();
  for (size_t i = 0; i < requests; ++i) {
    Request r;
    r.transfer = ticket;
    r.write = write;
    r.buffer = buffer + i * block;
    r.offset = offset + i * block;
    r.bytes = std::min(block, bytes - i * block);
    r.inject_eio = inject && i == 0;
    r.complete_after = complete_after;
    // Each thread takes a contiguous part of the transfer, as DeepSpeed splits one op.
    workers_[i * threads / requests]->push(std::move(r));
  }
  return ticket;
}

int NvmeFile::injected_submit_fault() {
  if (submit_fault_ == 0) return 0;
  return --submit_countdown_ == 0 ? submit_fault_ : 0;
}

void NvmeFile::finish(Transfer& transfer, const std::string& error) {
  {
    const std::lock_guard<std::mutex> lock(done_mutex_);
    if (!error.empty() && transfer.error.empty()) transfer.error = error;
    --transfer.remaining;
    if (--outstanding_ == 0) busy_ms_ += ms_since(busy_since_);
  }
  done_.notify_all();
}

double NvmeFile::busy_ms() {
  const std::lock_guard<std::mutex> lock(done_mutex_);
  return outstanding_ == 0 ? busy_ms_ : busy_ms_ + ms_since(busy_since_);
}

void NvmeFile::wait(const Ticket& ticket) {
  if (!ticket) return;
  std::unique_lock<std::mutex> lock(done_mutex_);
  done_.wait(lock, [&] { return ticket->remaining == 0; });
  if (!ticket->error.empty()) throw Error(ticket->error);
}

}  // namespace zero
