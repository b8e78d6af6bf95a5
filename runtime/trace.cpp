#include "zero/runtime/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <utility>

#include "zero/collectives/communicator.h"
#include "zero/core/check.h"
#include "zero/core/write_fully.h"

namespace zero {

namespace {

// Spans travel between ranks as text lines "kind\tbegin\tend\tbytes\tname", kind 0 compute, 1 a
// collective, 2 a counter (its time twice, its value as the bytes).
constexpr int kCounterKind = 2;

std::string serialize(const std::vector<TraceSpan>& spans,
                      const std::vector<TraceCounter>& counters) {
  std::string out;
  char line[128];
  for (const TraceSpan& s : spans) {
    std::snprintf(line, sizeof(line), "%d\t%.3f\t%.3f\t%llu\t", s.comm ? 1 : 0, s.begin_us,
                  s.end_us, static_cast<unsigned long long>(s.bytes));
    out += line;
    out += s.name;
    out += '\n';
  }
  for (const TraceCounter& c : counters) {
    std::snprintf(line, sizeof(line), "%d\t%.3f\t%.3f\t%llu\t", kCounterKind, c.time_us, c.time_us,
                  static_cast<unsigned long long>(c.value));
    out += line;
    out += c.name;
    out += '\n';
  }
  return out;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

// The trace file, every write and the close checked: a full disk is an error naming the file.
class TraceFile {
 public:
  explicit TraceFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ZERO_CHECK(fd_ >= 0,
               "cannot open trace file '" << path << "' for writing: " << std::strerror(errno));
  }
  ~TraceFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  void write(const std::string& text) {
    write_fully(fd_, text.data(), text.size(), "trace file '" + path_ + "'");
  }
  void close() {
    const int result = ::close(std::exchange(fd_, -1));
    ZERO_CHECK(result == 0, "cannot write trace file '" << path_ << "': " << std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

double Trace::now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

void Trace::add(TraceSpan span) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (spans_.size() >= kMaxSpans) {
    truncated_ = true;
    return;
  }
  spans_.push_back(std::move(span));
}

std::vector<TraceSpan> Trace::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_;
}

std::vector<TraceCounter> Trace::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

void Trace::add_counter(TraceCounter counter) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (counters_.size() >= kMaxSpans) {
    truncated_ = true;
    return;
  }
  counters_.push_back(std::move(counter));
}

void Trace::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.clear();
  counters_.clear();
  truncated_ = false;
}

void Trace::write_chrome_trace(Communicator& comm, const std::string& path) const {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    text = serialize(spans_, counters_);
  }
  if (truncated_) text += "0\t0\t0\t0\t(trace truncated: span limit reached)\n";
  // An all-gather moves the same count from every rank: pad every rank's text to the longest.
  const std::vector<uint64_t> sizes = all_gather_u64(comm, text.size());
  const uint64_t longest = *std::max_element(sizes.begin(), sizes.end());
  text.resize(longest, '\0');
  std::string all(longest * sizes.size(), '\0');
  comm.all_gather_bytes_sync(text.data(), all.data(), longest);
  if (comm.rank() != 0) return;

  TraceFile file(path);
  std::ostringstream out;
  // Microsecond timestamps of a long-running machine need all their digits: fixed notation.
  out << std::fixed << std::setprecision(3);
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  for (size_t r = 0; r < sizes.size(); ++r) {
    for (int tid = 0; tid < 2; ++tid) {
      out << (first ? "" : ",\n") << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << r
          << ",\"tid\":" << tid << ",\"args\":{\"name\":\"" << (tid ? "communication" : "compute")
          << "\"}}";
      first = false;
    }
    const std::string rank_text = all.substr(r * longest, sizes[r]);
    size_t pos = 0;
    while (pos < rank_text.size()) {
      size_t end = rank_text.find('\n', pos);
      if (end == std::string::npos) end = rank_text.size();
      const std::string line = rank_text.substr(pos, end - pos);
      pos = end + 1;
      int comm_flag = 0;
      double b = 0, e = 0;
      unsigned long long bytes = 0;
      int consumed = 0;
      if (std::sscanf(line.c_str(), "%d\t%lf\t%lf\t%llu\t%n", &comm_flag, &b, &e, &bytes,
                      &consumed) < 4) {
        continue;
      }
      if (comm_flag == kCounterKind) {
        out << ",\n{\"ph\":\"C\",\"pid\":" << r << ",\"name\":\""
            << json_escape(line.substr(static_cast<size_t>(consumed))) << "\",\"ts\":" << b
            << ",\"args\":{\"bytes\":" << bytes << "}}";
        continue;
      }
      out << ",\n{\"ph\":\"X\",\"pid\":" << r << ",\"tid\":" << comm_flag << ",\"name\":\""
          << json_escape(line.substr(static_cast<size_t>(consumed))) << "\",\"cat\":\""
          << (comm_flag ? "collective" : "compute") << "\",\"ts\":" << b << ",\"dur\":" << e - b;
      if (comm_flag) out << ",\"args\":{\"bytes\":" << bytes << "}";
      out << "}";
    }
    // A rank's events at a time: the text in memory stays one rank's.
    file.write(out.str());
    out.str("");
  }
  out << "\n]}\n";
  file.write(out.str());
  file.close();
}

ScopedSpan::ScopedSpan(Trace& trace, std::string name) : trace_(trace) {
  if (!trace_.enabled()) return;
  name_ = std::move(name);
  begin_us_ = Trace::now_us();
}

ScopedSpan::~ScopedSpan() {
  if (!trace_.enabled()) return;
  trace_.add(TraceSpan{std::move(name_), false, begin_us_, Trace::now_us(), 0});
}

}  // namespace zero
