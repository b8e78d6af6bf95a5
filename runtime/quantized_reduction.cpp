#include "quantized_reduction.h"

#include <cstdint>
#include <vector>

#include "memory_plan.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"
#include "zero/core/checked_size.h"
#include "zero/kernels/quantize_math.h"

namespace zero {

size_t quantized_chunk_bytes(size_t count) {
  return quantized_shard(count).region_bytes;
}

bool reduces_quantized(size_t count) {
  return count >= kWeightQuantizationBlock;
}

size_t quantized_reduction_bytes(size_t max_count, int ranks) {
  if (!reduces_quantized(max_count)) return 0;
  const char* what = "the quantized reduction's scratch";
  const size_t n = static_cast<size_t>(ranks);
  // Both hops' chunks out and in (n of each at most), the fp32 partial sums (one per node) and
  // one fp32 term being added.
  const size_t chunks = size_product(4 * n, quantized_chunk_bytes(max_count), what);
  const size_t sums = size_product(size_product(n + 1, max_count, what), sizeof(float), what);
  return size_sum(chunks, sums, what);
}

QuantizedReduceScatter::QuantizedReduceScatter(Communicator& comm, DeviceContext& device,
                                               CommTimeline& timeline)
    : comm_(comm), device_(device), timeline_(timeline) {
  const int n = comm.world_size();
  const int rank = comm.rank();
  const int per_node = ranks_per_node(comm);
  per_node_ = per_node >= 1 && n % per_node == 0 ? per_node : n;
  nodes_ = n / per_node_;
  // As hybrid sharding's groups: each group is named by the world rank of its first member,
  // which no group of another engine's communicator can share.
  const std::vector<uint64_t> members =
      all_gather_u64(comm, static_cast<uint64_t>(mpi_world_rank()));
  const auto color = [&](int first) {
    return static_cast<int>(members[static_cast<size_t>(first)]);
  };
  within_ = make_mpi_communicator_split(color(rank / per_node_ * per_node_), rank);
  across_ = make_mpi_communicator_split(color(rank % per_node_), rank);
  ZERO_CHECK(within_->world_size() == per_node_ && across_->world_size() == nodes_,
             "the quantized reduction's split gave groups of "
                 << within_->world_size() << " and " << across_->world_size() << " ranks, not "
                 << per_node_ << " and " << nodes_);
}

QuantizedReduceScatter::~QuantizedReduceScatter() = default;

void QuantizedReduceScatter::set_scratch(void* scratch, size_t bytes) {
  scratch_ = static_cast<char*>(scratch);
  scratch_bytes_ = bytes;
}

uint64_t QuantizedReduceScatter::sent_within_nodes() const {
  return within_->counters().total_bytes();
}

uint64_t QuantizedReduceScatter::sent_across_nodes() const {
  return across_->counters().total_bytes();
}

namespace {

// A quantized chunk: int8 values, then the scales.
int8_t* values_of(char* chunk) {
  return reinterpret_cast<int8_t*>(chunk);
}
float* scales_of(char* chunk, size_t count) {
  return reinterpret_cast<float*>(chunk + quantized_shard(count).values_bytes);
}

}  // namespace

// Rank (node g, place l) is rank g * L + l. Hop 1 sends local rank l' the chunks of ranks
// (g', l') for every node g'; hop 2 sends node g' the partial sum of chunk (g', l).
CommPoint QuantizedReduceScatter::reduce_scatter(const void* send, void* recv, size_t count,
                                                 DType dtype) {
  const size_t nodes = static_cast<size_t>(nodes_);
  const size_t per_node = static_cast<size_t>(per_node_);
  const size_t n = nodes * per_node;
  const size_t qc = quantized_chunk_bytes(count);
  ZERO_CHECK(reduces_quantized(count) &&
                 quantized_reduction_bytes(count, static_cast<int>(n)) <= scratch_bytes_,
             "internal error: a quantized reduce-scatter of "
                 << count << " elements with " << scratch_bytes_ << " bytes of scratch");
  char* hop1_out = scratch_;
  char* hop1_in = hop1_out + n * qc;
  char* hop2_out = hop1_in + n * qc;
  char* hop2_in = hop2_out + nodes * qc;
  float* partial = reinterpret_cast<float*>(hop2_in + nodes * qc);
  float* term = partial + nodes * count;
  const char* source = static_cast<const char*>(send);
  const size_t elem = dtype_size(dtype);
  DeviceContext* dev = &device_;
  Stream& stream = comm_.stream();
  Stream* on = &stream;

  // Quantizes `from` (count fp32 or dtype elements) into `chunk`.
  const auto quantize = [dev, on, count](const void* from, DType from_dtype, char* chunk) {
    dev->quantize_int8(from, from_dtype, count, kWeightQuantizationBlock, values_of(chunk),
                       scales_of(chunk, count), on);
  };
  // sum (fp32) = the chunks dequantized and added in order.
  const auto dequantize_sum = [dev, on, count, term](const std::vector<char*>& chunks, float* sum) {
    for (size_t k = 0; k < chunks.size(); ++k) {
      float* into = k == 0 ? sum : term;
      dev->dequantize_int8(values_of(chunks[k]), scales_of(chunks[k], count), count,
                           kWeightQuantizationBlock, into, DType::kFloat32, on);
      if (k > 0) dev->add(sum, DType::kFloat32, term, DType::kFloat32, count, on);
    }
  };
  // One hop: an all-to-all on `group`'s stream, ordered after and before this stream's work.
  const auto hop = [&](Communicator& group, const char* name, char* out, char* in, size_t bytes) {
    Stream& hop_stream = group.stream();
    hop_stream.wait(stream.record());
    timeline_.traced(hop_stream, name, bytes * static_cast<size_t>(group.world_size()),
                     [&] { return group.all_to_all_bytes(out, in, bytes); });
    stream.wait(hop_stream.record());
  };

  stream.enqueue([=] {
    for (size_t local = 0; local < per_node; ++local) {
      for (size_t node = 0; node < nodes; ++node) {
        const size_t destination = node * per_node + local;
        quantize(source + destination * count * elem, dtype,
                 hop1_out + (local * nodes + node) * qc);
      }
    }
  });
  hop(*within_, "all_to_all_within_nodes", hop1_out, hop1_in, nodes * qc);
  stream.enqueue([=] {
    for (size_t node = 0; node < nodes; ++node) {
      std::vector<char*> from_each_local_rank;
      for (size_t local = 0; local < per_node; ++local) {
        from_each_local_rank.push_back(hop1_in + (local * nodes + node) * qc);
      }
      dequantize_sum(from_each_local_rank, partial + node * count);
      quantize(partial + node * count, DType::kFloat32, hop2_out + node * qc);
    }
  });
  hop(*across_, "all_to_all_across_nodes", hop2_out, hop2_in, qc);
  stream.enqueue([=] {
    std::vector<char*> from_each_node;
    for (size_t node = 0; node < nodes; ++node) from_each_node.push_back(hop2_in + node * qc);
    dequantize_sum(from_each_node, partial);
    dev->cast(partial, DType::kFloat32, recv, dtype, count, on);
  });
  return timeline_.point(stream);
}

}  // namespace zero
