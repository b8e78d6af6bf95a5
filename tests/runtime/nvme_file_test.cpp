// The NVMe offload's files (under a directory of the build tree): free space checked before a
// file is made, busy time that counts only transfers outstanding, scratch files that follow no
// planted link, submissions the kernel takes in part or fails, and the injected slow disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/runtime/offload_test_util.h"
#include "zero/runtime/nvme_file.h"

namespace zero {
namespace {

using namespace zero::testing;

TEST(Offload, FreeSpaceIsCheckedWithBothNumbers) {
  const std::string path = nvme_dir() + "/too_large.swp";
  const uint64_t huge = uint64_t{1} << 60;
  const std::string message = error_of([&] { NvmeFile file(path, huge, AioConfig{}, 0); });
  expect_naming(message, "nvme_path " + nvme_dir() + "/ has ");
  expect_naming(message, " bytes (");
  expect_naming(message, "rank 0's offload file " + path +
                             " needs 1152921504606846976 bytes (1073741824.00 GiB)");
  EXPECT_FALSE(std::filesystem::exists(path));
  // What fits is taken.
  NvmeFile fits(path, 1 << 20, AioConfig{}, 0);
  EXPECT_EQ(fits.bytes(), 1u << 20);
}

// The file's busy time is the union of the spans its transfers were outstanding: a pass's wall
// time over it says how much compute the I/O hid, so idle time must not count, nor may two
// transfers in flight together count twice.
TEST(Offload, BusyTimeIsTheSpanTransfersWereOutstanding) {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  const size_t bytes = size_t{8} << 20;
  std::vector<char> memory(2 * bytes + kNvmeBufferSlack);
  char* buffer = nvme_aligned(memory.data());
  NvmeFile file(nvme_dir() + "/busy.swp", 2 * bytes, AioConfig{}, 0);
  EXPECT_EQ(file.busy_ms(), 0.0);
  const Clock::time_point first = Clock::now();
  file.wait(file.write(buffer, 0, bytes));
  const double first_span = ms_since(first);
  const double busy = file.busy_ms();
  EXPECT_GT(busy, 0.0);
  EXPECT_LE(busy, first_span);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(file.busy_ms(), busy) << "idle time counted as busy";
  const Clock::time_point both = Clock::now();
  const NvmeFile::Ticket write = file.write(buffer + bytes, bytes, bytes);
  const NvmeFile::Ticket read = file.read(buffer, 0, bytes);
  file.wait(write);
  file.wait(read);
  EXPECT_LE(file.busy_ms() - busy, ms_since(both)) << "transfers in flight together counted twice";
}

// A directory holding only a symbolic link at `name` to a file of known text beside it (as an
// attacker would plant one in a shared scratch directory), emptied first.
struct PlantedLink {
  explicit PlantedLink(const std::string& name) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(target) << kText;
    std::filesystem::create_symlink(target, dir + "/" + name);
  }
  // The target still holds its text, and the directory nothing but the link.
  void expect_untouched() const {
    std::ifstream in(target);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(text == kText) << "the planted link's target was written through: it holds "
                               << text.size() << " bytes";
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1)
        << dir << " should hold the planted link and nothing else";
  }
  static constexpr const char* kText = "not the run's to touch\n";
  const std::string dir = nvme_dir() + "/planted";
  const std::string target = nvme_dir() + "/planted_target";
};

// The mode bits of `fd` (fstat), and whether it has no name left.
std::pair<mode_t, bool> mode_and_unnamed(int fd) {
  struct stat info {};
  EXPECT_EQ(fstat(fd, &info), 0);
  return {info.st_mode & 07777, info.st_nlink == 0};
}

// Both ways of making a scratch file (unnamed, and the fallback's fresh name for a file system
// without O_TMPFILE) leave a link planted under the file's name alone, and give a file of mode
// 0600 that has no name.
TEST(Offload, ScratchFilesFollowNoPlantedLink) {
  for (const bool unnamed : {true, false}) {
    const PlantedLink planted("zero_optimizer_rank0.1234.swp");
    const int fd =
        create_scratch_file(planted.dir + "/zero_optimizer_rank0.1234.swp", O_DIRECT, unnamed);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const auto [mode, nameless] = mode_and_unnamed(fd);
    EXPECT_EQ(mode, 0600u) << "unnamed " << unnamed;
    EXPECT_TRUE(nameless) << "unnamed " << unnamed;
    ASSERT_EQ(close(fd), 0);
    planted.expect_untouched();
  }
}

// An NvmeFile at a name a link was planted under writes its own file (of mode 0600, found
// through /proc/self/fd as nothing else names it), never the link's target.
TEST(Offload, NvmeFilesFollowNoPlantedLink) {
  const PlantedLink planted("activations_rank_0.bin");
  std::vector<char> memory(2 * kNvmeAlignment);
  char* block = nvme_aligned(memory.data());
  std::fill(block, block + kNvmeAlignment, 'x');
  {
    NvmeFile file(planted.dir + "/activations_rank_0.bin", kNvmeAlignment, AioConfig{}, 0);
    file.wait(file.write(block, 0, kNvmeAlignment));
    std::vector<mode_t> modes;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code error;
      const std::string points_to = std::filesystem::read_symlink(entry.path(), error).string();
      if (error || points_to.rfind(planted.dir + "/", 0) != 0) continue;
      modes.push_back(mode_and_unnamed(std::stoi(entry.path().filename().string())).first);
    }
    EXPECT_EQ(modes, std::vector<mode_t>({0600})) << "the file's descriptor and mode";
  }
  planted.expect_untouched();
}

// A transfer of 4 requests (4 KiB blocks) and its wait on rank 0's file under `fault`, with a
// bound: a request left unsubmitted would hang the wait, which ends the test instead. Returns
// the wait's error, or "" when it succeeded.
std::string transfer_under_fault(NvmeFile& file, char* buffer, uint64_t offset) {
  std::promise<std::string> outcome;
  std::future<std::string> result = outcome.get_future();
  std::thread([&file, &outcome, buffer, offset] {
    try {
      file.wait(file.write(buffer, offset, 4 * kNvmeAlignment));
      outcome.set_value("");
    } catch (const Error& e) {
      outcome.set_value(e.what());
    }
  }).detach();
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "the transfer at offset %llu did not finish within 30 s\n",
                 static_cast<unsigned long long>(offset));
    std::_Exit(1);  // its worker waits forever: the file cannot be closed
  }
  return result.get();
}

AioConfig four_kib_blocks() {
  AioConfig aio;
  aio.block_size = kNvmeAlignment;
  return aio;
}

// A submission the kernel takes only part of (the first request of four): the rest go again,
// and the transfer completes with what was written.
TEST(Offload, ShortSubmitSendsTheRest) {
  const ScopedNvmeFault fault("short-submit@0");
  NvmeFile file(nvme_dir() + "/short_submit.swp", 8 * kNvmeAlignment, four_kib_blocks(), 0);
  std::vector<char> memory(9 * kNvmeAlignment);
  char* buffer = nvme_aligned(memory.data());
  for (size_t i = 0; i < 4 * kNvmeAlignment; ++i) buffer[i] = static_cast<char>(i / 4096 + 1);
  EXPECT_EQ(transfer_under_fault(file, buffer, 0), "");
  char* back = buffer + 4 * kNvmeAlignment;
  file.wait(file.read(back, 0, 4 * kNvmeAlignment));
  EXPECT_TRUE(std::equal(buffer, back, back)) << "what the short submit left out was not written";
}

// A failed submission fails its requests with the file, the offset and errno; what the ring
// still holds of them never reaches the kernel, and a later transfer of the file fails naming
// that error instead of sending them along.
TEST(Offload, SubmitErrorNamesFileOffsetAndErrno) {
  const ScopedNvmeFault fault("submit@0");
  const std::string path = nvme_dir() + "/submit_error.swp";
  NvmeFile file(path, 8 * kNvmeAlignment, four_kib_blocks(), 0);
  std::vector<char> memory(5 * kNvmeAlignment);
  char* buffer = nvme_aligned(memory.data());
  const std::string first = transfer_under_fault(file, buffer, 0);
  expect_naming(first, "nvme: write of " + path + " at offset 0 (4096 bytes) failed: ");
  expect_naming(first,
                "io_uring_submit: Input/output error (errno 5) [injected by "
                "ZERO_TEST_NVME_FAULT]");
  expect_naming(first, "nvme_store.cpp:");
  const std::string later = transfer_under_fault(file, buffer, 4 * kNvmeAlignment);
  expect_naming(later, "nvme: write of " + path + " at offset 16384 (4096 bytes) failed: ");
  expect_naming(later, "an earlier io_uring_submit of this file failed: Input/output error");
}

// The injected slow disk (tests of waits): each read takes the time asked at least and moves
// the same bytes, and a slow-read without its time is refused.
TEST(Offload, SlowReadTakesItsTimeAndMovesTheSameBytes) {
  {
    const ScopedNvmeFault fault("slow-read@0#30");
    NvmeFile file(nvme_dir() + "/slow_read.swp", 4 * kNvmeAlignment, four_kib_blocks(), 0);
    std::vector<char> memory(5 * kNvmeAlignment);
    char* buffer = nvme_aligned(memory.data());
    for (size_t i = 0; i < 2 * kNvmeAlignment; ++i) buffer[i] = static_cast<char>(i % 251);
    file.wait(file.write(buffer, 0, 2 * kNvmeAlignment));
    char* back = buffer + 2 * kNvmeAlignment;
    const auto start = std::chrono::steady_clock::now();
    file.wait(file.read(back, 0, 2 * kNvmeAlignment));
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
    EXPECT_TRUE(std::equal(buffer, back, back));
  }
  const ScopedNvmeFault fault("slow-read@0");
  const std::string message =
      error_of([&] { NvmeFile bad(nvme_dir() + "/slow_read_bad.swp", kNvmeAlignment, {}, 0); });
  expect_naming(message, "slow-read@RANK#MS, got 'slow-read@0'");
}

}  // namespace
}  // namespace zero
