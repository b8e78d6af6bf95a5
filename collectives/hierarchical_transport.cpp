// The hierarchical path of the CPU communicator (hierarchical_transport.h).
#include "hierarchical_transport.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::backend {
namespace {

// Node blocks of an all-reduce start on multiples of this many elements (cache lines, whole
// vectors), as the shared-memory all-reduce's do.
constexpr size_t kBlockAlignment = 64;

const unsigned char* at(const void* p, size_t offset) {
  return static_cast<const unsigned char*>(p) + offset;
}

unsigned char* at(void* p, size_t offset) {
  return static_cast<unsigned char*>(p) + offset;
}

// `n` elements of `type` laid out every `stride_bytes`: one rank's piece of a strided block.
struct StridedType {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  StridedType(size_t n, MPI_Datatype element, size_t stride_bytes) {
    MPI_Datatype contiguous = MPI_DATATYPE_NULL;
    ZERO_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(n), element, &contiguous));
    const int status =
        MPI_Type_create_resized(contiguous, 0, static_cast<MPI_Aint>(stride_bytes), &type);
    ZERO_MPI_CHECK(MPI_Type_free(&contiguous));
    ZERO_MPI_CHECK(status);
    const int committed = MPI_Type_commit(&type);
    if (committed != MPI_SUCCESS) MPI_Type_free(&type);  // the commit's error is the one to report
    ZERO_MPI_CHECK(committed);
  }
  StridedType(const StridedType&) = delete;
  StridedType& operator=(const StridedType&) = delete;
  ~StridedType() {
    if (MPI_Type_free(&type) != MPI_SUCCESS) {
      std::fprintf(stderr, "zero: MPI_Type_free of a hierarchical collective's type failed\n");
    }
  }
};

MPI_Comm split(MPI_Comm comm, int color, int key) {
  MPI_Comm part = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split(comm, color, key, &part));
  ZERO_MPI_CHECK(MPI_Comm_set_errhandler(part, MPI_ERRORS_RETURN));
  return part;
}

}  // namespace

HierarchicalTransport::HierarchicalTransport(MPI_Comm comm, const NodeGroups& groups,
                                             size_t max_elements_per_call)
    : nodes_(groups.nodes),
      per_node_(groups.ranks_per_node),
      node_index_(groups.node_index),
      local_index_(groups.local_index),
      max_per_call_(max_elements_per_call) {
  ZERO_CHECK(groups.regular(),
             "the hierarchical collectives need the same number of "
             "consecutive ranks on every node: "
                 << groups.irregular);
  try {
    node_ = split(comm, node_index_, local_index_);
    across_ = split(comm, local_index_, node_index_);
    in_node_ = std::make_unique<SharedMemoryTransport>(node_);
  } catch (...) {
    // No destructor runs for a half-made transport: the groups made so far go here.
    for (MPI_Comm* group : {&node_, &across_}) {
      if (*group != MPI_COMM_NULL) MPI_Comm_free(group);
    }
    throw;
  }
  sources_.resize(static_cast<size_t>(nodes_));
  bounds_.resize(static_cast<size_t>(per_node_) + 1);
}

HierarchicalTransport::~HierarchicalTransport() {
  in_node_.reset();
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  // Both are freed whatever the first one's result.
  const int node_freed = MPI_Comm_free(&node_);
  const int across_freed = MPI_Comm_free(&across_);
  if (node_freed != MPI_SUCCESS || across_freed != MPI_SUCCESS) {
    std::fprintf(stderr, "zero: MPI_Comm_free of the hierarchical collectives' groups failed\n");
  }
}

void HierarchicalTransport::exchange_blocks(const float* send, float* recv, size_t block) {
  for (size_t offset = 0; offset < block;) {
    const size_t n = std::min(max_per_call_, block - offset);
    const StridedType piece(n, MPI_FLOAT, block * sizeof(float));
    ZERO_MPI_CHECK(
        MPI_Alltoall(send + offset, 1, piece.type, recv + offset, 1, piece.type, across_));
    offset += n;
  }
}

void HierarchicalTransport::gather_blocks(float* data, size_t block) {
  for (size_t offset = 0; offset < block;) {
    const size_t n = std::min(max_per_call_, block - offset);
    const StridedType piece(n, MPI_FLOAT, block * sizeof(float));
    ZERO_MPI_CHECK(
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data + offset, 1, piece.type, across_));
    offset += n;
  }
}

void HierarchicalTransport::sum_nodes(float* sum, const float* received, size_t block) {
  if (block == 0) return;
  for (int m = 0; m < nodes_; ++m) sources_[static_cast<size_t>(m)] = received + m * block;
  kernels::sum_in_order(sum, sources_.data(), sources_.size(), DType::kFloat32, block);
}

// Pieces of an all-reduce's node block that each node sums: the node blocks start on
// kBlockAlignment elements, so all but the last local rank's are `aligned` long.
size_t HierarchicalTransport::all_reduce_piece(size_t count, size_t* aligned) const {
  const size_t per_node = static_cast<size_t>(per_node_);
  const size_t block = (count + per_node - 1) / per_node;
  *aligned = (block + kBlockAlignment - 1) / kBlockAlignment * kBlockAlignment;
  const size_t nodes = static_cast<size_t>(nodes_);
  return (*aligned + nodes - 1) / nodes;
}

size_t HierarchicalTransport::staging_bytes(CollectiveOp op, size_t count) const {
  const size_t nodes = static_cast<size_t>(nodes_);
  size_t aligned = 0;
  switch (op) {
    case CollectiveOp::kReduceScatter:
      return 2 * nodes * count * sizeof(float);
    case CollectiveOp::kAllReduce:
      return 2 * nodes * all_reduce_piece(count, &aligned) * sizeof(float);
    case CollectiveOp::kAllGather:
    case CollectiveOp::kBroadcast:
    case CollectiveOp::kBarrier:
    case CollectiveOp::kAllToAll:
      break;
  }
  return 0;
}

void HierarchicalTransport::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                           float* staging) {
  if (count == 0) return;
  const size_t elem = dtype_size(dtype);
  const size_t per_node = static_cast<size_t>(per_node_);
  const size_t nodes = static_cast<size_t>(nodes_);
  float* partials = staging;
  float* received = staging + nodes * count;
  for (size_t l = 0; l <= per_node; ++l) bounds_[l] = l * count;
  for (size_t m = 0; m < nodes; ++m) {
    in_node_->reduce_scatter_blocks(at(send, m * per_node * count * elem), dtype, bounds_.data(),
                                    partials + m * count, DType::kFloat32);
  }
  exchange_blocks(partials, received, count);
  // Only now is recv written: in place, it is part of send, which the node's sums have read.
  if (dtype == DType::kFloat32) {
    sum_nodes(static_cast<float*>(recv), received, count);
  } else {
    sum_nodes(received, received, count);
    kernels::cast(received, DType::kFloat32, recv, dtype, count);
  }
}

void HierarchicalTransport::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  if (bytes_per_rank == 0) return;
  const size_t node_bytes = static_cast<size_t>(per_node_) * bytes_per_rank;
  // Across nodes: this rank's chunk lands at its place in every node's part of recv.
  unsigned char* column = at(recv, static_cast<size_t>(local_index_) * bytes_per_rank);
  const bool in_place = send == column + static_cast<size_t>(node_index_) * node_bytes;
  for (size_t offset = 0; offset < bytes_per_rank;) {
    const size_t n = std::min(max_per_call_, bytes_per_rank - offset);
    const StridedType piece(n, MPI_BYTE, node_bytes);
    ZERO_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : at(send, offset), static_cast<int>(n),
                                 MPI_BYTE, column + offset, 1, piece.type, across_));
    offset += n;
  }
  // Inside the node, every node's part, in place: each rank's chunk is there already.
  for (size_t m = 0; m < static_cast<size_t>(nodes_); ++m) {
    unsigned char* part = at(recv, m * node_bytes);
    in_node_->all_gather(part + static_cast<size_t>(local_index_) * bytes_per_rank, part,
                         bytes_per_rank);
  }
}

void HierarchicalTransport::all_reduce(const void* send, void* recv, size_t count, DType dtype,
                                       float* staging) {
  if (count == 0) return;
  const size_t elem = dtype_size(dtype);
  const size_t per_node = static_cast<size_t>(per_node_);
  const size_t nodes = static_cast<size_t>(nodes_);
  size_t aligned = 0;
  const size_t largest_piece = all_reduce_piece(count, &aligned);
  for (size_t l = 0; l <= per_node; ++l) bounds_[l] = std::min(l * aligned, count);
  const size_t begin = bounds_[static_cast<size_t>(local_index_)];
  const size_t mine = bounds_[static_cast<size_t>(local_index_) + 1] - begin;
  // This rank's block, padded with zeros to whole pieces of the nodes (the same length on
  // every rank of this local index, so their calls match).
  const size_t piece = (mine + nodes - 1) / nodes;
  float* partials = staging;
  float* received = staging + nodes * largest_piece;
  std::fill(partials + mine, partials + nodes * piece, 0.0f);
  in_node_->reduce_scatter_blocks(send, dtype, bounds_.data(), partials, DType::kFloat32);
  exchange_blocks(partials, received, piece);
  sum_nodes(partials + static_cast<size_t>(node_index_) * piece, received, piece);
  gather_blocks(partials, piece);
  // In place, send is recv: the node's sums have read this rank's block of it already, and
  // the peers read only their slots.
  if (mine > 0) {
    kernels::cast(partials, DType::kFloat32, at(recv, begin * elem), dtype, mine);
  }
  for (size_t& bound : bounds_) bound *= elem;
  in_node_->all_gather_blocks(at(recv, begin * elem), recv, bounds_.data());
}

}  // namespace zero::backend
