// Writing a whole buffer to a file descriptor, as every writer of files needs it: the
// checkpoint's files, the trace and the metrics file.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "zero/core/check.h"

namespace zero {

// Writes all of data, retrying short writes and EINTR. injected_errno != 0 makes the first
// write fail with that errno instead (the checkpoint tests' fault switch). Throws zero::Error
// "cannot write WHAT: REASON", `what` naming the file.
inline void write_fully(int fd, const void* data, size_t size, const std::string& what,
                        int injected_errno = 0) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n;
    if (injected_errno != 0) {
      errno = injected_errno;
      n = -1;
    } else {
      n = ::write(fd, p, size);
    }
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n >= 0, "cannot write " << what << ": " << std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace zero
