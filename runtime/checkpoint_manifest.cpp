// The checkpoint manifest: its text form (the message in protobuf text format, then a CRC32C
// trailer) and its validation, one check per section, so that every value a load relies on is
// in range before any shard file is read. proto/checkpoint.proto documents the fields.
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>

#include "checkpoint_format.h"
#include "zero/core/check.h"
#include "zero/core/text.h"
#include "zero/optimizer/optimizer.h"
#include "zero/proto/checkpoint.pb.h"

namespace zero::checkpoint_files {
namespace {

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

// A problem with the manifest at `path`: throws zero::Error naming it.
class Bad {
 public:
  explicit Bad(const std::string& path) : path_(path) {}
  [[noreturn]] void operator()(const std::string& what) const {
    ZERO_FAIL("checkpoint manifest " << path_ << ": " << what);
  }

 private:
  const std::string& path_;
};

// Checks the "# crc32c XXXXXXXX" trailer; returns the size of the text before it.
size_t check_trailer(const std::string& text, const std::string& path) {
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

  return body_size;
}

// format_version, world_size, stage, dtype and alignment_bytes.
void read_header(const zero::checkpoint::Manifest& m, const Bad& bad, CheckpointInfo* info) {
  if (m.format_version() != kFormatVersion) {
    bad("format_version " + std::to_string(m.format_version()) +
        " is not supported (this build "
        "reads version " +
        std::to_string(kFormatVersion) + ")");
  }
  if (m.world_size() < 1)
    bad("world_size must be at least 1, got " + std::to_string(m.world_size()));
  info->world_size = m.world_size();
  if (m.stage() < 0 || m.stage() > 3) bad("stage must be 0-3, got " + std::to_string(m.stage()));
  info->stage = m.stage();
  if (!parse_dtype(m.dtype(), &info->dtype)) bad("unknown dtype '" + m.dtype() + "'");
  info->alignment_bytes = m.alignment_bytes();
  // Absent (0) in checkpoints of runs without tensor parallelism.
  info->tensor_parallel_size = m.tensor_parallel_size() == 0 ? 1 : m.tensor_parallel_size();
  if (info->tensor_parallel_size < 1 || m.tensor_parallel_rank() < 0 ||
      m.tensor_parallel_rank() >= info->tensor_parallel_size) {
    bad("tensor_parallel_rank " + std::to_string(m.tensor_parallel_rank()) +
        " is not a rank of tensor_parallel_size " + std::to_string(m.tensor_parallel_size()));
  }
  info->tensor_parallel_rank = m.tensor_parallel_rank();
}

void read_units(const zero::checkpoint::Manifest& m, const Bad& bad, CheckpointInfo* info) {
  for (int u = 0; u < m.units_size(); ++u) {
    const zero::checkpoint::Unit& unit = m.units(u);
    // Divided rather than multiplied: shard * world_size can wrap around to numel.
    if (unit.numel() % static_cast<uint64_t>(info->world_size) != 0 ||
        unit.numel() / static_cast<uint64_t>(info->world_size) != unit.shard()) {
      bad("unit " + std::to_string(u) + " has numel " + std::to_string(unit.numel()) +
          ", not world_size * shard = " + std::to_string(info->world_size) + " * " +
          std::to_string(unit.shard()));
    }
    info->units.push_back({unit.numel(), unit.shard()});
  }
}

// Each parameter: a unique name, a shape that gives its numel, and a place inside its unit.
void read_params(const zero::checkpoint::Manifest& m, const Bad& bad, CheckpointInfo* info) {
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
    if (p.has_split()) {
      out.split = {p.split().dim(), p.split().parts(), p.split().full_extent()};
      const char* problem = split_problem(out.split, out.shape, info->tensor_parallel_size);
      if (*problem != '\0' || !out.split.is_split()) {
        bad("parameter '" + p.name() + "' " + shape_text(out.shape) + " has " +
            (*problem != '\0' ? problem : "a split dimension below 0") +
            " over tensor_parallel_size " + std::to_string(info->tensor_parallel_size));
      }
    }
    info->params.push_back(std::move(out));
  }
}

// The optimizer's type, hyperparameters, number of state arrays and step.
void read_optimizer(const zero::checkpoint::Optimizer& opt, const Bad& bad, CheckpointInfo* info) {
  if (!parse_optimizer_type_key(opt.type(), &info->optimizer.type)) {
    bad("unknown optimizer type '" + opt.type() + "'");
  }
  info->optimizer.lr = static_cast<float>(opt.lr());
  info->optimizer.beta1 = opt.beta1();
  info->optimizer.beta2 = opt.beta2();
  info->optimizer.eps = static_cast<float>(opt.eps());
  info->optimizer.weight_decay = static_cast<float>(opt.weight_decay());
  info->optimizer.momentum = static_cast<float>(opt.momentum());
  try {
    const int expected_count = Optimizer(info->optimizer).state_count();
    if (opt.state_count() != expected_count) {
      bad("optimizer " + opt.type() + " keeps " + std::to_string(expected_count) +
          " state arrays, the manifest says " + std::to_string(opt.state_count()));
    }
  } catch (const Error& e) {
    bad(std::string("bad optimizer hyperparameters: ") + e.what());
  }
  info->state_count = opt.state_count();
  if (opt.step() < 0) bad("optimizer step is negative");
  info->optimizer_step = static_cast<long>(opt.step());
}

void read_lr_schedule(const zero::checkpoint::LrSchedule& lr, const Bad& bad,
                      CheckpointInfo* info) {
  if (!parse_lr_schedule_type_key(lr.type(), &info->lr_schedule.type)) {
    bad("unknown lr_schedule type '" + lr.type() + "'");
  }
  info->lr_schedule.max_lr = static_cast<float>(lr.max_lr());
  info->lr_schedule.min_lr = static_cast<float>(lr.min_lr());
  info->lr_schedule.warmup_steps = static_cast<long>(lr.warmup_steps());
  info->lr_schedule.total_steps = static_cast<long>(lr.total_steps());
  info->lr_schedule.cos_min_ratio = static_cast<float>(lr.cos_min_ratio());
  // A manifest without warmup_type has a linear warm-up.
  if (lr.warmup_type().empty()) {
    info->lr_schedule.warmup_type = LrWarmupType::kLinear;
  } else if (!parse_lr_warmup_type(lr.warmup_type(), &info->lr_schedule.warmup_type)) {
    bad("unknown lr_schedule warmup_type '" + lr.warmup_type() + "'");
  }
}

// The loss scaler's state and the trainer's position.
void read_scaler_and_trainer(const zero::checkpoint::Manifest& m, const Bad& bad,
                             CheckpointInfo* info) {
  const zero::checkpoint::LossScaler& scaler = m.loss_scaler();
  if (!(scaler.scale() > 0.0f) || !std::isfinite(scaler.scale())) {
    bad("loss_scaler scale must be positive and finite");
  }
  if (scaler.hysteresis_left() < 0 || scaler.clean_steps() < 0) {
    bad("loss_scaler hysteresis_left and clean_steps must not be negative");
  }
  info->loss_scaler = {scaler.scale(), scaler.hysteresis_left(),
                       static_cast<long>(scaler.clean_steps())};
  if (m.trainer().step() < 0) bad("trainer step is negative");
  info->trainer.step = static_cast<long>(m.trainer().step());
  info->trainer.seed = m.trainer().seed();
}

void read_shard_files(const zero::checkpoint::Manifest& m, const Bad& bad, CheckpointInfo* info) {
  // One file per rank, each of the size the layout implies.
  if (m.files_size() != info->world_size) {
    bad("lists " + std::to_string(m.files_size()) + " shard files for world_size " +
        std::to_string(info->world_size));
  }
  // The shard file size must fit a file offset (pread takes an off_t), or it would wrap.
  const uint64_t bytes_per_element = (1 + static_cast<uint64_t>(info->state_count)) * 4;
  const uint64_t max_elements =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / bytes_per_element;
  uint64_t elements_per_file = 0;
  for (const CheckpointInfo::SavedUnit& unit : info->units) {
    if (unit.shard > max_elements - elements_per_file) {
      bad("the units' shards add up to shard files too large to address");
    }
    elements_per_file += unit.shard;
  }
  const uint64_t file_size = unit_byte_offsets(info->units, info->state_count).back();
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
    info->files.push_back({f.name(), f.size(), f.crc32c()});
  }
}

}  // namespace

std::string manifest_text(const CheckpointInfo& info) {
  zero::checkpoint::Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_world_size(info.world_size);
  m.set_stage(info.stage);
  m.set_dtype(dtype_name(info.dtype));
  m.set_alignment_bytes(info.alignment_bytes);
  if (info.tensor_parallel_size > 1) {
    m.set_tensor_parallel_size(info.tensor_parallel_size);
    m.set_tensor_parallel_rank(info.tensor_parallel_rank);
  }
  for (const ParamPlacement& p : info.params) {
    zero::checkpoint::Param* out = m.add_params();
    out->set_name(p.name);
    for (int64_t d : p.shape) out->add_shape(d);
    out->set_dtype(dtype_name(info.dtype));
    out->set_unit(p.unit);
    out->set_offset(p.offset);
    out->set_numel(p.numel);
    out->set_module(p.module);
    if (p.split.is_split()) {
      zero::checkpoint::TensorSplit* split = out->mutable_split();
      split->set_dim(p.split.dim);
      split->set_parts(p.split.parts);
      split->set_full_extent(p.split.full_extent);
    }
  }
  for (const CheckpointInfo::SavedUnit& u : info.units) {
    zero::checkpoint::Unit* out = m.add_units();
    out->set_numel(u.numel);
    out->set_shard(u.shard);
  }
  zero::checkpoint::Optimizer* opt = m.mutable_optimizer();
  opt->set_type(optimizer_type_key(info.optimizer.type));
  opt->set_lr(info.optimizer.lr);
  opt->set_beta1(info.optimizer.beta1);
  opt->set_beta2(info.optimizer.beta2);
  opt->set_eps(info.optimizer.eps);
  opt->set_weight_decay(info.optimizer.weight_decay);
  opt->set_momentum(info.optimizer.momentum);
  opt->set_state_count(info.state_count);
  opt->set_step(info.optimizer_step);
  zero::checkpoint::LrSchedule* lr = m.mutable_lr_schedule();
  lr->set_type(lr_schedule_type_key(info.lr_schedule.type));
  lr->set_max_lr(info.lr_schedule.max_lr);
  lr->set_min_lr(info.lr_schedule.min_lr);
  lr->set_warmup_steps(info.lr_schedule.warmup_steps);
  lr->set_total_steps(info.lr_schedule.total_steps);
  lr->set_cos_min_ratio(info.lr_schedule.cos_min_ratio);
  lr->set_warmup_type(lr_warmup_type_name(info.lr_schedule.warmup_type));
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
  const size_t body_size = check_trailer(text, path);
  zero::checkpoint::Manifest m;
  google::protobuf::TextFormat::Parser parser;
  ParseErrors errors;
  parser.RecordErrorsTo(&errors);
  ZERO_CHECK(parser.ParseFromString(text.substr(0, body_size), &m),
             "checkpoint manifest " << path << " does not parse: " << errors.text);

  const Bad bad(path);
  CheckpointInfo info;
  read_header(m, bad, &info);
  read_units(m, bad, &info);
  read_params(m, bad, &info);
  read_optimizer(m.optimizer(), bad, &info);
  read_lr_schedule(m.lr_schedule(), bad, &info);
  read_scaler_and_trainer(m, bad, &info);
  read_shard_files(m, bad, &info);
  return info;
}

}  // namespace zero::checkpoint_files
