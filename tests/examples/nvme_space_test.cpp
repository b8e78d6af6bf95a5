// zero-train's NVMe space check on its own: what the ranks of a node write to one file system
// is summed before it is compared with the free space.
#include <gtest/gtest.h>

#include "examples/nvme_space.h"

namespace zero::examples {
namespace {

// Two ranks whose files fit one at a time, on one tmpfs: together they do not.
TEST(NvmeSpace, RanksSharingAFileSystemAreSummed) {
  const std::vector<FileSystemShare> shares = {{0, 7, 409600, 163840, "/scratch"},
                                               {0, 7, 409600, 94208, "/scratch"},
                                               {1, 7, 409600, 163840, "/scratch"},
                                               {1, 7, 409600, 94208, "/scratch"}};
  EXPECT_EQ(overcommitted_file_system(shares),
            "nvme_path /scratch: its file system has 409600 bytes (400.00 KiB) free, but the 2 "
            "rank(s) on this node write 516096 bytes (504.00 KiB) to it (rank 0: 258048, rank 1: "
            "258048)");
  // One rank alone fits.
  EXPECT_EQ(overcommitted_file_system({shares[0], shares[1]}), "");
}

// Shares on different file systems are apart: each fits its own; the one that does not is named
// by its own directory, with the least free space any rank saw.
TEST(NvmeSpace, FileSystemsAreCountedApart) {
  EXPECT_EQ(overcommitted_file_system({{0, 1, 1000, 600, "/a"}, {1, 2, 1000, 600, "/b"}}), "");
  EXPECT_EQ(overcommitted_file_system(
                {{0, 1, 1000, 600, "/a"}, {0, 2, 1000, 600, "/b"}, {1, 2, 900, 400, "/b2"}}),
            "nvme_path /b: its file system has 900 bytes (900 B) free, but the 2 rank(s) on this "
            "node write 1000 bytes (1000 B) to it (rank 0: 600, rank 1: 400)");
  EXPECT_EQ(overcommitted_file_system({}), "");
}

// Sums that pass 2^64 are refused, not wrapped.
TEST(NvmeSpace, ASumPast64BitsDoesNotFit) {
  const std::string message = overcommitted_file_system(
      {{0, 1, UINT64_MAX, UINT64_MAX, "/a"}, {1, 1, UINT64_MAX, 2, "/a"}});
  EXPECT_NE(message.find("more than 2^64 bytes"), std::string::npos) << message;
}

}  // namespace
}  // namespace zero::examples
