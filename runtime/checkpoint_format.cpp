// The parts of checkpointing that need no MPI: CRC32C, the manifest's text form and its
// validation, resolving a path to a step directory, checking and reading shard files, and the
// safetensors writer. zero-checkpoint uses these directly; checkpoint.cpp builds the collective
// save and load on them.
#include <fcntl.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint_format.h"
#include "zero/core/check.h"
#include "zero/proto/checkpoint.pb.h"

// Shard files hold host memory as written: little-endian fp32 is the format.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint files are little-endian");

namespace zero {

// ---- CRC32C: slicing-by-8 over tables built at compile time (reflected polynomial 0x82F63B78).
// Eight bytes per step through eight tables runs at a few GB/s, well ahead of the disk.
namespace {

struct Crc32cTables {
  uint32_t t[8][256];
};

constexpr Crc32cTables make_crc32c_tables() {
  Crc32cTables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    tables.t[0][i] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) {
      const uint32_t prev = tables.t[k - 1][i];
      tables.t[k][i] = (prev >> 8) ^ tables.t[0][prev & 0xffu];
    }
  }
  return tables;
}

constexpr Crc32cTables kCrc = make_crc32c_tables();

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = kCrc.t[7][word & 0xff] ^ kCrc.t[6][(word >> 8) & 0xff] ^ kCrc.t[5][(word >> 16) & 0xff] ^
          kCrc.t[4][(word >> 24) & 0xff] ^ kCrc.t[3][(word >> 32) & 0xff] ^
          kCrc.t[2][(word >> 40) & 0xff] ^ kCrc.t[1][(word >> 48) & 0xff] ^ kCrc.t[0][word >> 56];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = kCrc.t[0][(crc ^ *p++) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

namespace checkpoint_files {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

const char* optimizer_type_name(OptimizerType t) {
  switch (t) {
    case OptimizerType::kAdamW:
      return "adamw";
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kSgd:
      return "sgd";
  }
  return "?";
}

const char* schedule_type_name(LrScheduleType t) {
  switch (t) {
    case LrScheduleType::kConstant:
      return "constant";
    case LrScheduleType::kWarmup:
      return "warmup";
    case LrScheduleType::kWarmupLinearDecay:
      return "warmup_linear_decay";
    case LrScheduleType::kWarmupCosine:
      return "warmup_cosine";
  }
  return "?";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

// Collects the text-format parser's complaints with their 1-based line and column.
class ParseErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (text.empty())
      text = "line " + std::to_string(line + 1) + " column " + std::to_string(column + 1) + ": " +
             message;
  }
  std::string text;
};

}  // namespace

std::string step_dir_name(long step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08ld", step);
  return name;
}

std::string shard_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.bin", rank);
  return name;
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::vector<uint64_t> unit_byte_offsets(const std::vector<CheckpointInfo::SavedUnit>& units,
                                        int state_count) {
  std::vector<uint64_t> offsets(units.size() + 1, 0);
  for (size_t u = 0; u < units.size(); ++u) {
    offsets[u + 1] = offsets[u] + units[u].shard * (1 + static_cast<uint64_t>(state_count)) * 4;
  }
  return offsets;
}

// ---- The manifest.

std::string manifest_text(const CheckpointInfo& info) {
  zero::checkpoint::Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_world_size(info.world_size);
  m.set_stage(info.stage);
  m.set_dtype(dtype_name(info.dtype));
  m.set_alignment_bytes(info.alignment_bytes);
  for (const ParamPlacement& p : info.params) {
    zero::checkpoint::Param* out = m.add_params();
    out->set_name(p.name);
    for (int64_t d : p.shape) out->add_shape(d);
    out->set_dtype(dtype_name(info.dtype));
    out->set_unit(p.unit);
    out->set_offset(p.offset);
    out->set_numel(p.numel);
    out->set_module(p.module);
  }
  for (const CheckpointInfo::SavedUnit& u : info.units) {
    zero::checkpoint::Unit* out = m.add_units();
    out->set_numel(u.numel);
    out->set_shard(u.shard);
  }
  zero::checkpoint::Optimizer* opt = m.mutable_optimizer();
  opt->set_type(optimizer_type_name(info.optimizer.type));
  opt->set_lr(info.optimizer.lr);
  opt->set_beta1(info.optimizer.beta1);
  opt->set_beta2(info.optimizer.beta2);
  opt->set_eps(info.optimizer.eps);
  opt->set_weight_decay(info.optimizer.weight_decay);
  opt->set_momentum(info.optimizer.momentum);
  opt->set_state_count(info.state_count);
  opt->set_step(info.optimizer_step);
  zero::checkpoint::LrSchedule* lr = m.mutable_lr_schedule();
  lr->set_type(schedule_type_name(info.lr_schedule.type));
  lr->set_max_lr(info.lr_schedule.max_lr);
  lr->set_min_lr(info.lr_schedule.min_lr);
  lr->set_warmup_steps(info.lr_schedule.warmup_steps);
  lr->set_total_steps(info.lr_schedule.total_steps);
  lr->set_cos_min_ratio(info.lr_schedule.cos_min_ratio);
  lr->set_warmup_type(info.lr_schedule.warmup_type == LrWarmupType::kLog ? "log" : "linear");
  m.mutable_loss_scaler()->set_scale(info.loss_scaler.scale);
  m.mutable_loss_scaler()->set_hysteresis_left(info.loss_scaler.hysteresis_left);
  m.mutable_loss_scaler()->set_clean_steps(info.loss_scaler.clean_steps);
  m.mutable_trainer()->set_step(info.trainer.step);
  m.mutable_trainer()->set_seed(info.trainer.seed);
  for (size_t r = 0; r < info.files.size(); ++r) {
    zero::checkpoint::ShardFile* f = m.add_files();
    f->set_rank(static_cast<int>(r));
    f->set_name(info.files[r].name);
    f->set_size(info.files[r].size);
    f->set_crc32c(info.files[r].crc32c);
  }
  std::string text;
  ZERO_CHECK(google::protobuf::TextFormat::PrintToString(m, &text),
             "could not print the checkpoint manifest as text");
  char trailer[32];
  std::snprintf(trailer, sizeof(trailer), "# crc32c %08" PRIx32 "\n",
                crc32c(text.data(), text.size()));
  return text + trailer;
}

CheckpointInfo parse_manifest(const std::string& text, const std::string& path) {
  // The last line is "# crc32c XXXXXXXX": a manifest cut short by a crash has no such line.
  const std::string prefix = "# crc32c ";
  const size_t trailer_size = prefix.size() + 8 + 1;
  ZERO_CHECK(
      text.size() >= trailer_size && text.back() == '\n',
      "checkpoint manifest " << path << " is truncated: it does not end with the '# crc32c' line");
  const size_t body_size = text.size() - trailer_size;
  const std::string trailer = text.substr(body_size);
  ZERO_CHECK(
      (body_size == 0 || text[body_size - 1] == '\n') &&
          trailer.compare(0, prefix.size(), prefix) == 0,
      "checkpoint manifest " << path << " is truncated: it does not end with the '# crc32c' line");
  const std::string hex = trailer.substr(prefix.size(), 8);
  ZERO_CHECK(
      hex.find_first_not_of("0123456789abcdef") == std::string::npos,
      "checkpoint manifest " << path << ": bad checksum line '" << trailer.substr(0, 17) << "'");
  const uint32_t expected = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
  const uint32_t actual = crc32c(text.data(), body_size);
  ZERO_CHECK(actual == expected, "checkpoint manifest "
                                     << path << " is corrupt: its CRC32C is " << std::hex << actual
                                     << " but its last line records " << expected);

  zero::checkpoint::Manifest m;
  google::protobuf::TextFormat::Parser parser;
  ParseErrors errors;
  parser.RecordErrorsTo(&errors);
  ZERO_CHECK(parser.ParseFromString(text.substr(0, body_size), &m),
             "checkpoint manifest " << path << " does not parse: " << errors.text);

  auto bad = [&](const std::string& what) {
    ZERO_FAIL("checkpoint manifest " << path << ": " << what);
  };
  if (m.format_version() != kFormatVersion) {
    bad("format_version " + std::to_string(m.format_version()) +
        " is not supported (this build "
        "reads version " +
        std::to_string(kFormatVersion) + ")");
  }
  CheckpointInfo info;
  if (m.world_size() < 1)
    bad("world_size must be at least 1, got " + std::to_string(m.world_size()));
  info.world_size = m.world_size();
  if (m.stage() < 0 || m.stage() > 3) bad("stage must be 0-3, got " + std::to_string(m.stage()));
  info.stage = m.stage();
  if (!parse_dtype(m.dtype(), &info.dtype)) bad("unknown dtype '" + m.dtype() + "'");
  info.alignment_bytes = m.alignment_bytes();

  for (int u = 0; u < m.units_size(); ++u) {
    const zero::checkpoint::Unit& unit = m.units(u);
    // Divided rather than multiplied: shard * world_size can wrap around to numel.
    if (unit.numel() % static_cast<uint64_t>(info.world_size) != 0 ||
        unit.numel() / static_cast<uint64_t>(info.world_size) != unit.shard()) {
      bad("unit " + std::to_string(u) + " has numel " + std::to_string(unit.numel()) +
          ", not world_size * shard = " + std::to_string(info.world_size) + " * " +
          std::to_string(unit.shard()));
    }
    info.units.push_back({unit.numel(), unit.shard()});
  }
  std::set<std::string> names;
  for (const zero::checkpoint::Param& p : m.params()) {
    if (p.name().empty()) bad("a parameter has an empty name");
    if (!names.insert(p.name()).second) bad("parameter '" + p.name() + "' appears twice");
    ParamPlacement out;
    out.name = p.name();
    uint64_t numel = 1;
    for (int64_t d : p.shape()) {
      if (d < 0) bad("parameter '" + p.name() + "' has a negative dimension");
      if (d > 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
        bad("parameter '" + p.name() + "' has a shape with more than 2^64 elements");
      }
      out.shape.push_back(d);
      numel *= static_cast<uint64_t>(d);
    }
    if (numel != p.numel()) {
      bad("parameter '" + p.name() + "' has shape " + shape_text(out.shape) + " but numel " +
          std::to_string(p.numel()));
    }
    if (p.dtype() != m.dtype()) {
      bad("parameter '" + p.name() + "' has dtype '" + p.dtype() + "', the checkpoint '" +
          m.dtype() + "'");
    }
    if (p.unit() < 0 || p.unit() >= m.units_size()) {
      bad("parameter '" + p.name() + "' is in unit " + std::to_string(p.unit()) + " of " +
          std::to_string(m.units_size()));
    }
    // Written so that offset + numel cannot wrap around.
    const uint64_t unit_numel = m.units(p.unit()).numel();
    if (p.offset() > unit_numel || p.numel() > unit_numel - p.offset()) {
      bad("parameter '" + p.name() + "' (offset " + std::to_string(p.offset()) + ", numel " +
          std::to_string(p.numel()) + ") runs past the end of unit " + std::to_string(p.unit()));
    }
    out.numel = p.numel();
    out.module = p.module();
    out.unit = p.unit();
    out.offset = p.offset();
    info.params.push_back(std::move(out));
  }

  const zero::checkpoint::Optimizer& opt = m.optimizer();
  if (opt.type() == "adamw") {
    info.optimizer.type = OptimizerType::kAdamW;
  } else if (opt.type() == "adam") {
    info.optimizer.type = OptimizerType::kAdam;
  } else if (opt.type() == "sgd") {
    info.optimizer.type = OptimizerType::kSgd;
  } else {
    bad("unknown optimizer type '" + opt.type() + "'");
  }
  info.optimizer.lr = static_cast<float>(opt.lr());
  info.optimizer.beta1 = opt.beta1();
  info.optimizer.beta2 = opt.beta2();
  info.optimizer.eps = static_cast<float>(opt.eps());
  info.optimizer.weight_decay = static_cast<float>(opt.weight_decay());
  info.optimizer.momentum = static_cast<float>(opt.momentum());
  try {
    const int expected_count = Optimizer(info.optimizer).state_count();
    if (opt.state_count() != expected_count) {
      bad("optimizer " + opt.type() + " keeps " + std::to_string(expected_count) +
          " state arrays, the manifest says " + std::to_string(opt.state_count()));
    }
  } catch (const Error& e) {
    bad(std::string("bad optimizer hyperparameters: ") + e.what());
  }
  info.state_count = opt.state_count();
  if (opt.step() < 0) bad("optimizer step is negative");
  info.optimizer_step = static_cast<long>(opt.step());

  const zero::checkpoint::LrSchedule& lr = m.lr_schedule();
  const std::array<LrScheduleType, 4> schedules = {
      LrScheduleType::kConstant, LrScheduleType::kWarmup, LrScheduleType::kWarmupLinearDecay,
      LrScheduleType::kWarmupCosine};
  bool schedule_known = false;
  for (LrScheduleType t : schedules) {
    if (lr.type() == schedule_type_name(t)) {
      info.lr_schedule.type = t;
      schedule_known = true;
    }
  }
  if (!schedule_known) bad("unknown lr_schedule type '" + lr.type() + "'");
  info.lr_schedule.max_lr = static_cast<float>(lr.max_lr());
  info.lr_schedule.min_lr = static_cast<float>(lr.min_lr());
  info.lr_schedule.warmup_steps = static_cast<long>(lr.warmup_steps());
  info.lr_schedule.total_steps = static_cast<long>(lr.total_steps());
  info.lr_schedule.cos_min_ratio = static_cast<float>(lr.cos_min_ratio());
  if (lr.warmup_type() == "log") {
    info.lr_schedule.warmup_type = LrWarmupType::kLog;
  } else if (lr.warmup_type() == "linear" || lr.warmup_type().empty()) {
    info.lr_schedule.warmup_type = LrWarmupType::kLinear;
  } else {
    bad("unknown lr_schedule warmup_type '" + lr.warmup_type() + "'");
  }

  const zero::checkpoint::LossScaler& scaler = m.loss_scaler();
  if (!(scaler.scale() > 0.0f) || !std::isfinite(scaler.scale())) {
    bad("loss_scaler scale must be positive and finite");
  }
  if (scaler.hysteresis_left() < 0 || scaler.clean_steps() < 0) {
    bad("loss_scaler hysteresis_left and clean_steps must not be negative");
  }
  info.loss_scaler = {scaler.scale(), scaler.hysteresis_left(),
                      static_cast<long>(scaler.clean_steps())};
  if (m.trainer().step() < 0) bad("trainer step is negative");
  info.trainer.step = static_cast<long>(m.trainer().step());
  info.trainer.seed = m.trainer().seed();

  // One file per rank, each of the size the layout implies.
  if (m.files_size() != info.world_size) {
    bad("lists " + std::to_string(m.files_size()) + " shard files for world_size " +
        std::to_string(info.world_size));
  }
  // The shard file size must fit a file offset (pread takes an off_t), or it would wrap.
  const uint64_t bytes_per_element = (1 + static_cast<uint64_t>(info.state_count)) * 4;
  const uint64_t max_elements =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / bytes_per_element;
  uint64_t elements_per_file = 0;
  for (const CheckpointInfo::SavedUnit& unit : info.units) {
    if (unit.shard > max_elements - elements_per_file) {
      bad("the units' shards add up to shard files too large to address");
    }
    elements_per_file += unit.shard;
  }
  const uint64_t file_size = unit_byte_offsets(info.units, info.state_count).back();
  for (int r = 0; r < m.files_size(); ++r) {
    const zero::checkpoint::ShardFile& f = m.files(r);
    if (f.rank() != r || f.name() != shard_file_name(r)) {
      bad("shard file entry " + std::to_string(r) + " is '" + f.name() + "' (rank " +
          std::to_string(f.rank()) + "), expected " + shard_file_name(r));
    }
    if (f.size() != file_size) {
      bad(f.name() + " is listed with " + std::to_string(f.size()) + " bytes; the layout needs " +
          std::to_string(file_size));
    }
    info.files.push_back({f.name(), f.size(), f.crc32c()});
  }
  return info;
}

// ---- Files.

void write_fully(int fd, const void* data, size_t size, const std::string& path,
                 int injected_errno) {
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
    ZERO_CHECK(n >= 0, "cannot write " << path << ": " << errno_text());
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open " << path << " to fsync it: " << errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  ZERO_CHECK(rc == 0, "fsync of " << path << " failed: " << errno_text());
}

std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open " << path << ": " << errno_text());
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      ZERO_CHECK(n == 0, "cannot read " << path << ": " << errno_text());
      return text;
    }
    text.append(buffer, static_cast<size_t>(n));
  }
}

std::string check_shard_file(const CheckpointInfo& info, int rank) {
  const CheckpointInfo::File& file = info.files[rank];
  const std::string path = join(info.step_dir, file.name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return path + ": cannot open: " + errno_text();
  std::vector<char> buffer(1 << 20);
  uint64_t size = 0;
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = errno_text();
      ::close(fd);
      return path + ": read error: " + why;
    }
    if (n == 0) break;
    crc = crc32c(buffer.data(), static_cast<size_t>(n), crc);
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (size != file.size) {
    return path + ": size is " + std::to_string(size) + " bytes, the manifest says " +
           std::to_string(file.size);
  }
  if (crc != file.crc32c) {
    char text[96];
    std::snprintf(text, sizeof(text),
                  ": checksum mismatch (CRC32C %08" PRIx32 ", the manifest says %08" PRIx32 ")",
                  crc, file.crc32c);
    return path + text;
  }
  return "";
}

ShardReader::ShardReader(const CheckpointInfo& info)
    : info_(info), unit_offsets_(unit_byte_offsets(info.units, info.state_count)) {}

ShardReader::~ShardReader() {
  for (auto& entry : fds_) ::close(entry.second);
}

int ShardReader::open_verified(int rank) {
  auto found = fds_.find(rank);
  if (found != fds_.end()) return found->second;
  const std::string problem = check_shard_file(info_, rank);
  ZERO_CHECK(problem.empty(), "corrupt checkpoint: " << problem);
  const std::string path = join(info_.step_dir, info_.files[rank].name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open " << path << ": " << errno_text());
  fds_[rank] = fd;
  return fd;
}

void ShardReader::read(int array, size_t param, size_t first, size_t count, float* out) {
  const ParamPlacement& p = info_.params[param];
  const CheckpointInfo::SavedUnit& unit = info_.units[p.unit];
  ZERO_CHECK(first + count <= p.numel && array >= 0 && array <= info_.state_count,
             "checkpoint read out of range: " << p.name << " array " << array);
  // Element e of the unit lives in rank e / shard's file, at index e % shard of each array.
  size_t element = p.offset + first;
  while (count > 0) {
    const int rank = static_cast<int>(element / unit.shard);
    const size_t index = element % unit.shard;
    const size_t n = std::min(count, unit.shard - index);
    const uint64_t at = unit_offsets_[p.unit] + (array * unit.shard + index) * sizeof(float);
    const int fd = open_verified(rank);
    char* dest = reinterpret_cast<char*>(out);
    size_t bytes = n * sizeof(float);
    uint64_t offset = at;
    while (bytes > 0) {
      const ssize_t got = ::pread(fd, dest, bytes, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      ZERO_CHECK(got > 0, "cannot read " << join(info_.step_dir, info_.files[rank].name)
                                         << " at byte " << offset << ": "
                                         << (got == 0 ? "unexpected end of file" : errno_text()));
      dest += got;
      offset += static_cast<uint64_t>(got);
      bytes -= static_cast<size_t>(got);
    }
    out += n;
    element += n;
    count -= n;
  }
}

}  // namespace checkpoint_files

// ---- Public entry points that work without MPI.

namespace {

bool exists(const std::string& path, struct stat* st) {
  return ::stat(path.c_str(), st) == 0;
}

// A step directory, a save directory holding `latest`, or a `latest` file -> the step directory.
std::string resolve_step_dir(const std::string& path) {
  using checkpoint_files::join;
  struct stat st;
  ZERO_CHECK(exists(path, &st), "no checkpoint at " << path << ": " << std::strerror(errno));
  std::string pointer;
  if (S_ISDIR(st.st_mode)) {
    std::string trimmed = path;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const std::string base = trimmed.substr(trimmed.find_last_of('/') + 1);
    if (exists(join(path, checkpoint_files::kManifestName), &st)) {
      ZERO_CHECK(base.rfind(checkpoint_files::kTmpPrefix, 0) != 0,
                 path << " is an unfinished save (a crash interrupted it); load the checkpoint "
                         "its save directory's 'latest' names");
      return path;
    }
    pointer = join(path, checkpoint_files::kLatestName);
    ZERO_CHECK(exists(pointer, &st),
               path << " holds no checkpoint: it has neither " << checkpoint_files::kManifestName
                    << " (a step directory) nor a '" << checkpoint_files::kLatestName
                    << "' file (a save directory)");
  } else {
    pointer = path;
  }
  std::string name = checkpoint_files::read_small_file(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  ZERO_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
             pointer << " does not name a step directory (it holds '" << name << "')");
  const size_t slash = pointer.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : pointer.substr(0, slash);
  const std::string step_dir = join(parent, name);
  ZERO_CHECK(exists(join(step_dir, checkpoint_files::kManifestName), &st),
             pointer << " names " << name << ", but "
                     << join(step_dir, checkpoint_files::kManifestName) << " does not exist");
  return step_dir;
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const std::string step_dir = resolve_step_dir(path);
  const std::string manifest = checkpoint_files::join(step_dir, checkpoint_files::kManifestName);
  CheckpointInfo info =
      checkpoint_files::parse_manifest(checkpoint_files::read_small_file(manifest), manifest);
  info.step_dir = step_dir;
  return info;
}

std::vector<std::string> verify_checkpoint_files(const CheckpointInfo& info) {
  std::vector<std::string> problems;
  for (int r = 0; r < static_cast<int>(info.files.size()); ++r) {
    std::string problem = checkpoint_files::check_shard_file(info, r);
    if (!problem.empty()) problems.push_back(std::move(problem));
  }
  return problems;
}

std::vector<std::vector<float>> read_full_master(const CheckpointInfo& info) {
  checkpoint_files::ShardReader reader(info);
  std::vector<std::vector<float>> out(info.params.size());
  for (size_t p = 0; p < info.params.size(); ++p) {
    out[p].resize(info.params[p].numel);
    reader.read(0, p, 0, out[p].size(), out[p].data());
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       DType dtype,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  ZERO_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16,
             "safetensors export supports fp32, bf16 and fp16, not " << dtype_name(dtype));
  // The header lists tensors in data order; ordered_json keeps that order for readers' sake.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& entry : metadata) meta[entry.first] = entry.second;
    header["__metadata__"] = meta;
  }
  const size_t elem = dtype_size(dtype);
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    ZERO_CHECK(!t.name.empty() && t.name != "__metadata__" && !header.contains(t.name),
               "safetensors: bad or duplicate tensor name '" << t.name << "'");
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    ZERO_CHECK(numel == t.values->size(), "safetensors: tensor '" << t.name << "' has "
                                                                  << t.values->size()
                                                                  << " values for its shape");
    const char* type = dtype == DType::kFloat32    ? "F32"
                       : dtype == DType::kBFloat16 ? "BF16"
                                                   : "F16";
    header[t.name] = {
        {"dtype", type}, {"shape", t.shape}, {"data_offsets", {offset, offset + numel * elem}}};
    offset += numel * elem;
  }
  std::string text = header.dump();
  // Pad the header with spaces (the spec allows trailing whitespace) so the data starts 8-byte
  // aligned, as Hugging Face's writer does: readers may then map the tensors in place.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  const uint64_t header_size = text.size();

  // Written to a temporary name and renamed, so a failed export leaves no truncated file.
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0, "cannot create " << tmp << ": " << std::strerror(errno));
  try {
    checkpoint_files::write_fully(fd, &header_size, sizeof(header_size), tmp);
    checkpoint_files::write_fully(fd, text.data(), text.size(), tmp);
    std::vector<uint16_t> half;
    for (const NamedTensor& t : tensors) {
      if (dtype == DType::kFloat32) {
        checkpoint_files::write_fully(fd, t.values->data(), t.values->size() * sizeof(float), tmp);
        continue;
      }
      half.resize(t.values->size());
      for (size_t i = 0; i < half.size(); ++i) {
        const float v = (*t.values)[i];
        half[i] = dtype == DType::kBFloat16 ? float_to_bf16(v) : float_to_fp16(v);
      }
      checkpoint_files::write_fully(fd, half.data(), half.size() * sizeof(uint16_t), tmp);
    }
    ZERO_CHECK(::fsync(fd) == 0, "fsync of " << tmp << " failed: " << std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  const int rc = ::close(fd);
  if (rc != 0) ::unlink(tmp.c_str());
  ZERO_CHECK(rc == 0, "cannot close " << tmp << ": " << std::strerror(errno));
  ZERO_CHECK(::rename(tmp.c_str(), path.c_str()) == 0,
             "cannot rename " << tmp << " to " << path << ": " << std::strerror(errno));
}

}  // namespace zero
