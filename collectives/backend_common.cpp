// The Communicator backends' shared definitions that are not templates (backend_common.h): the
// settings from the environment, the argument checks, and the desync check's descriptors.
#include "backend_common.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "zero/core/check.h"

namespace zero::backend {

std::chrono::milliseconds timeout_from_environment() {
  const char* text = std::getenv("ZERO_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return kDefaultTimeout;
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  ZERO_CHECK(
      end != text && *end == '\0' && errno == 0 && std::isfinite(seconds) && seconds > 0,
      "ZERO_COLLECTIVE_TIMEOUT_S must be a positive number of seconds, got '" << text << "'");
  const double ms = std::min(seconds * 1000.0, static_cast<double>(kLongestTimeout.count()));
  return std::max(std::chrono::milliseconds(1), std::chrono::milliseconds(std::llround(ms)));
}

bool desync_check_from_environment() {
  const char* text = std::getenv("ZERO_DEBUG");
  if (text == nullptr) return false;
  const std::string modes(text);
  for (size_t begin = 0; begin <= modes.size();) {
    size_t end = modes.find(',', begin);
    if (end == std::string::npos) end = modes.size();
    if (modes.compare(begin, end - begin, "collectives") == 0) return true;
    begin = end + 1;
  }
  return false;
}

namespace {

// True when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

void check_size(size_t count, size_t elem, int ranks, const char* op) {
  ZERO_CHECK(count <= SIZE_MAX / elem / static_cast<size_t>(ranks),
             op << ": count " << count << " times " << ranks << " ranks overflows size_t");
}

void check_buffers(const void* send, const void* recv, size_t count, const char* op) {
  ZERO_CHECK(count == 0 || (send != nullptr && recv != nullptr),
             op << ": null buffer with count " << count);
}

struct NamedBuffer {
  const void* data;
  const char* name;  // as the interface calls it: "send", "recv"
};

// all_gather and reduce_scatter pair one block of `count` elements with a buffer of all ranks'
// blocks; the only overlap allowed is this rank's block of the whole (in place).
bool check_block_of_all(const char* op, NamedBuffer block, NamedBuffer all_blocks, size_t count,
                        size_t elem, int rank, int ranks) {
  check_size(count, elem, ranks, op);
  check_buffers(block.data, all_blocks.data, count, op);
  const size_t block_bytes = count * elem;
  const bool in_place = block.data == bytes_at(all_blocks.data, rank * block_bytes);
  ZERO_CHECK(in_place || !overlap(block.data, block_bytes, all_blocks.data, block_bytes * ranks),
             op << ": " << block.name << " overlaps " << all_blocks.name
                << "; the only overlap allowed is " << block.name << " == " << all_blocks.name
                << " + rank * count (in place)");
  return in_place;
}

}  // namespace

bool check_all_gather(const void* send, const void* recv, size_t count, size_t element_bytes,
                      int rank, int ranks) {
  return check_block_of_all("all_gather", {send, "send"}, {recv, "recv"}, count, element_bytes,
                            rank, ranks);
}

bool check_reduce_scatter(const void* send, const void* recv, size_t count, DType dtype, int rank,
                          int ranks) {
  return check_block_of_all("reduce_scatter", {recv, "recv"}, {send, "send"}, count,
                            dtype_size(dtype), rank, ranks);
}

bool check_all_reduce(const void* send, const void* recv, size_t count, DType dtype, int ranks) {
  const size_t elem = dtype_size(dtype);
  check_size(count, elem, ranks, "all_reduce");
  check_buffers(send, recv, count, "all_reduce");
  const bool in_place = send == recv;
  ZERO_CHECK(
      in_place || !overlap(send, count * elem, recv, count * elem),
      "all_reduce: send and recv partially overlap; they must be disjoint or equal (in place)");
  return in_place;
}

void check_broadcast(const void* buffer, size_t count, DType dtype, int root, int ranks) {
  check_size(count, dtype_size(dtype), ranks, "broadcast");
  check_buffers(buffer, buffer, count, "broadcast");
  ZERO_CHECK(root >= 0 && root < ranks, "broadcast: root "
                                            << root << " is not a rank of this communicator (0 to "
                                            << ranks - 1 << ")");
}

void check_all_to_all(const void* send, const void* recv, size_t bytes, int ranks) {
  check_size(bytes, 1, ranks, "all_to_all");
  check_buffers(send, recv, bytes, "all_to_all");
  const size_t total = bytes * static_cast<size_t>(ranks);
  ZERO_CHECK(!overlap(send, total, recv, total),
             "all_to_all: send and recv overlap; an all-to-all cannot run in place");
}

std::string not_finished_after(Clock::duration elapsed) {
  char text[64];
  std::snprintf(text, sizeof(text), "has not finished after %.1f s",
                std::chrono::duration<double>(elapsed).count());
  return text;
}

CollectiveDescriptor::CollectiveDescriptor(uint64_t sequence_, CollectiveOp op_,
                                           const Payload& payload)
    : sequence(sequence_),
      op(static_cast<uint64_t>(op_)),
      dtype(payload.bytes ? kBytes : static_cast<uint64_t>(payload.dtype)),
      count(payload.count) {}

std::string CollectiveDescriptor::text() const {
  const bool bytes = dtype == kBytes;
  return describe_collective(static_cast<CollectiveOp>(op), count,
                             bytes ? DType::kFloat32 : static_cast<DType>(dtype), bytes);
}

std::string desync_message(const std::vector<CollectiveDescriptor>& all) {
  size_t other = 1;
  while (other < all.size() && all[other] == all[0]) ++other;
  if (other == all.size()) return "";
  const CollectiveDescriptor& first = all[0];
  const CollectiveDescriptor& differing = all[other];
  std::string message = "zero: collective desync";
  if (first.sequence == differing.sequence) {
    message += " at #" + std::to_string(first.sequence) + ": rank 0 called " + first.text() +
               ", rank " + std::to_string(other) + " called " + differing.text();
  } else {
    message += ": rank 0 called " + first.text() + " as #" + std::to_string(first.sequence) +
               ", rank " + std::to_string(other) + " called " + differing.text() + " as #" +
               std::to_string(differing.sequence);
  }
  return message;
}

}  // namespace zero::backend
