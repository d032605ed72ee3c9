// ExpertDispatcher: rows to the ranks that own their experts and back, by MPI_Alltoallv. One
// MPI_Allgather per call carries every rank's checks, shapes and per-expert row counts, so that
// each rank knows every send and receive count (and every failure) before any row moves.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "distributed/mpi_call.hpp"
#include "grouplin/dtype.hpp"
#include "grouplin/expert_parallel.hpp"

namespace grouplin {

using distributed::check_mpi;
using distributed::failure_of;
using distributed::gather_agreed;

ExpertRange rank_experts(int64_t experts, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw Error(ErrorCode::InvalidArgument, "expert parallelism: rank " + std::to_string(rank) +
                                                " of " + std::to_string(ranks) +
                                                ", expected 0 <= rank < ranks");
  }
  if (experts < 1 || experts % ranks != 0) {
    throw Error(ErrorCode::ExpertsNotDivisible,
                "expert parallelism: " + std::to_string(experts) + " experts over " +
                    std::to_string(ranks) + " ranks: expected a positive multiple of the ranks");
  }
  const int64_t per = experts / ranks;
  return {rank * per, (rank + 1) * per};
}

ExpertDispatcher::ExpertDispatcher(MPI_Comm comm, int64_t num_experts) : num_experts_(num_experts) {
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  rank_ = distributed::comm_rank(comm_);
  ranks_ = distributed::comm_size(comm_);
  const auto all = gather_agreed(comm_, std::nullopt, {num_experts});
  for (int r = 0; r < ranks_; ++r) {
    if (all[static_cast<size_t>(r)][0] != num_experts) {
      MPI_Comm_free(&comm_);
      throw Error(ErrorCode::RanksDisagree, "expert parallelism: rank 0 has " +
                                                std::to_string(all[0][0]) + " experts, rank " +
                                                std::to_string(r) + " has " +
                                                std::to_string(all[static_cast<size_t>(r)][0]) +
                                                "; expected the same on all");
    }
  }
  try {
    experts_ = rank_experts(num_experts, rank_, ranks_);
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

ExpertDispatcher::~ExpertDispatcher() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

namespace {

// What every rank says about the rows it passes: dtype, features, rows.
enum Slot : size_t { kDType, kFeatures, kRows, kSlots };

// Every rank's rows must share the dtype and the feature count: the same answer on every rank,
// from the gathered headers.
void check_same_rows(const std::vector<std::vector<int64_t>>& all, const std::string& what) {
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r][kDType] != all[0][kDType]) {
      throw Error(ErrorCode::DTypeMismatch,
                  what + ": rank 0 passes " +
                      std::string(dtype_name(static_cast<DType>(all[0][kDType]))) + ", rank " +
                      std::to_string(r) + " " +
                      std::string(dtype_name(static_cast<DType>(all[r][kDType]))) +
                      "; expected the same dtype on every rank");
    }
    if (all[r][kFeatures] != all[0][kFeatures]) {
      throw Error(ErrorCode::RanksDisagree,
                  what + ": rank 0 passes rows of " + std::to_string(all[0][kFeatures]) +
                      " features, rank " + std::to_string(r) + " of " +
                      std::to_string(all[r][kFeatures]) + "; expected the same on every rank");
    }
  }
}

void check_rows(const Tensor& t, const std::string& what) {
  if (!t.defined() || t.rank() != 2) {
    throw Error(ErrorCode::ShapeMismatch,
                what + ": expected a 2-D tensor [rows, features], got " +
                    (t.defined() ? shape_to_string(t.shape()) : std::string("an undefined one")));
  }
  if (t.dim(0) >= INT_MAX) {
    throw Error(ErrorCode::SizeOverflow, what + ": " + std::to_string(t.dim(0)) +
                                             " rows; at most " + std::to_string(INT_MAX - 1) +
                                             " per rank (MPI counts are int)");
  }
}

// An MPI datatype of one row of `bytes` bytes, freed at scope exit.
class RowType {
 public:
  explicit RowType(int64_t bytes) {
    check_mpi(MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &type_),
              "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&type_), "MPI_Type_commit");
  }
  ~RowType() { MPI_Type_free(&type_); }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

}  // namespace

Tensor ExpertDispatcher::dispatch(const Tensor& x, std::span<const int64_t> expert_of_row) {
  return dispatch_checked(x, expert_of_row, [] {});
}

Tensor ExpertDispatcher::dispatch_checked(const Tensor& x, std::span<const int64_t> expert_of_row,
                                          const std::function<void()>& extra_check) {
  const std::string what = "dispatch";
  std::vector<int64_t> header(kSlots + static_cast<size_t>(num_experts_), 0);
  const auto failure = failure_of([&] {
    check_rows(x, what + " of x");
    extra_check();
    if (static_cast<int64_t>(expert_of_row.size()) != x.dim(0)) {
      throw Error(ErrorCode::ShapeMismatch, what + ": x has " + std::to_string(x.dim(0)) +
                                                " rows, expert_of_row " +
                                                std::to_string(expert_of_row.size()) +
                                                " entries; expected one expert per row");
    }
    for (size_t i = 0; i < expert_of_row.size(); ++i) {
      const int64_t e = expert_of_row[i];
      if (e < 0 || e >= num_experts_) {
        throw Error(ErrorCode::OutOfBounds,
                    what + ": expert_of_row[" + std::to_string(i) + "] is " + std::to_string(e) +
                        ", expected an expert in [0, " + std::to_string(num_experts_) + ")");
      }
      ++header[kSlots + static_cast<size_t>(e)];
    }
    header[kDType] = static_cast<int64_t>(x.dtype());
    header[kFeatures] = x.dim(1);
    header[kRows] = x.dim(0);
  });
  const auto all = gather_agreed(comm_, failure, header);
  check_same_rows(all, what);
  // MPI counts and displacements are int: no rank may receive more rows than that. Every rank
  // sees every count, so every rank throws alike.
  const int64_t per = num_experts_ / ranks_;  // experts per rank
  for (int q = 0; q < ranks_; ++q) {
    int64_t incoming = 0;
    for (const auto& row : all) {
      for (int64_t e = q * per; e < (q + 1) * per; ++e) incoming += row[kSlots + e];
    }
    if (incoming >= INT_MAX) {
      throw Error(ErrorCode::SizeOverflow, what + ": rank " + std::to_string(q) +
                                               " would receive " + std::to_string(incoming) +
                                               " rows; at most " + std::to_string(INT_MAX - 1) +
                                               " per call (MPI counts are int)");
    }
  }

  // The caller's rows in expert order (stable: each expert's rows in the caller's order), which
  // is also destination order, the experts of a rank being consecutive.
  std::vector<int64_t> first(static_cast<size_t>(num_experts_) + 1, 0);
  for (int64_t e = 0; e < num_experts_; ++e) {
    first[static_cast<size_t>(e) + 1] = first[static_cast<size_t>(e)] + header[kSlots + e];
  }
  order_.assign(static_cast<size_t>(x.dim(0)), 0);
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  for (size_t i = 0; i < expert_of_row.size(); ++i) {
    order_[static_cast<size_t>(next[static_cast<size_t>(expert_of_row[i])]++)] =
        static_cast<int64_t>(i);
  }
  send_rows_.assign(static_cast<size_t>(ranks_), 0);
  recv_rows_.assign(static_cast<size_t>(ranks_), 0);
  for (int p = 0; p < ranks_; ++p) {
    send_rows_[static_cast<size_t>(p)] = static_cast<int>(
        first[static_cast<size_t>((p + 1) * per)] - first[static_cast<size_t>(p * per)]);
  }
  // Received rows: from each rank in turn, its rows of this rank's experts in expert order.
  // Local (expert-major) row j is received row local_from_[j].
  const size_t local = static_cast<size_t>(per);
  local_splits_.assign(local, 0);
  std::vector<std::vector<int64_t>> block_start(static_cast<size_t>(ranks_),
                                                std::vector<int64_t>(local, 0));
  int64_t received = 0;
  for (int q = 0; q < ranks_; ++q) {
    int64_t from_q = 0;
    for (size_t e = 0; e < local; ++e) {
      const int64_t n = all[static_cast<size_t>(q)][kSlots + experts_.begin + e];
      block_start[static_cast<size_t>(q)][e] = received + from_q;
      from_q += n;
      local_splits_[e] += n;
    }
    recv_rows_[static_cast<size_t>(q)] = static_cast<int>(from_q);
    received += from_q;
  }
  local_from_.assign(static_cast<size_t>(received), 0);
  size_t j = 0;
  for (size_t e = 0; e < local; ++e) {
    for (int q = 0; q < ranks_; ++q) {
      const int64_t n = all[static_cast<size_t>(q)][kSlots + experts_.begin + e];
      for (int64_t k = 0; k < n; ++k) local_from_[j++] = block_start[static_cast<size_t>(q)][e] + k;
    }
  }
  rows_ = x.dim(0);
  routed_ = true;
  return exchange(x, true);
}

Tensor ExpertDispatcher::redispatch(const Tensor& rows) {
  return redispatch_checked(rows, [] {});
}

Tensor ExpertDispatcher::redispatch_checked(const Tensor& rows,
                                            const std::function<void()>& extra_check) {
  const auto failure = failure_of([&] {
    if (!routed_) {
      throw Error(ErrorCode::BackwardBeforeForward,
                  "redispatch: no rows were dispatched yet; dispatch routes them first");
    }
    check_rows(rows, "redispatch");
    extra_check();
    if (rows.dim(0) != rows_) {
      throw Error(ErrorCode::ShapeMismatch, "redispatch: " + std::to_string(rows.dim(0)) +
                                                " rows, expected the last dispatch's " +
                                                std::to_string(rows_));
    }
  });
  const auto all = gather_agreed(
      comm_, failure,
      {failure ? 0 : static_cast<int64_t>(rows.dtype()), failure ? 0 : rows.dim(1), 0});
  check_same_rows(all, "redispatch");
  return exchange(rows, true);
}

Tensor ExpertDispatcher::combine(const Tensor& y) {
  const int64_t local_rows = static_cast<int64_t>(local_from_.size());
  const auto failure = failure_of([&] {
    if (!routed_) {
      throw Error(ErrorCode::BackwardBeforeForward,
                  "combine: no rows were dispatched yet; dispatch routes them first");
    }
    check_rows(y, "combine");
    if (y.dim(0) != local_rows) {
      throw Error(ErrorCode::ShapeMismatch,
                  "combine: " + std::to_string(y.dim(0)) + " rows, expected the " +
                      std::to_string(local_rows) + " rows the last dispatch brought here");
    }
  });
  const auto all = gather_agreed(
      comm_, failure, {failure ? 0 : static_cast<int64_t>(y.dtype()), failure ? 0 : y.dim(1), 0});
  check_same_rows(all, "combine");
  return exchange(y, false);
}

// Forward direction: the caller's rows (row order_[k] sent k-th), received into expert-major
// order. Backward direction: expert-major rows sent back in received order, returned in the
// caller's order.
Tensor ExpertDispatcher::exchange(const Tensor& from, bool forward_direction) {
  const int64_t row_bytes = from.dim(1) * static_cast<int64_t>(dtype_size(from.dtype()));
  const std::vector<int>& send_counts = forward_direction ? send_rows_ : recv_rows_;
  const std::vector<int>& recv_counts = forward_direction ? recv_rows_ : send_rows_;
  const std::vector<int64_t>& send_index = forward_direction ? order_ : local_from_;
  const std::vector<int64_t>& recv_index = forward_direction ? local_from_ : order_;
  const auto rb = static_cast<size_t>(row_bytes);
  // Rows into send order.
  std::vector<std::byte> send(send_index.size() * rb), recv(recv_index.size() * rb);
  const std::byte* src = from.data();
  if (forward_direction) {
    for (size_t k = 0; k < send_index.size(); ++k) {
      std::memcpy(send.data() + k * rb, src + static_cast<size_t>(send_index[k]) * rb, rb);
    }
  } else {
    for (size_t j = 0; j < send_index.size(); ++j) {
      std::memcpy(send.data() + static_cast<size_t>(send_index[j]) * rb, src + j * rb, rb);
    }
  }
  Tensor out = Tensor::zeros({static_cast<int64_t>(recv_index.size()), from.dim(1)}, from.dtype());
  if (row_bytes > 0) {
    const RowType row(row_bytes);
    const std::vector<int> sd = displacements(send_counts), rd = displacements(recv_counts);
    std::byte dummy{};
    check_mpi(MPI_Alltoallv(send.empty() ? &dummy : send.data(), send_counts.data(), sd.data(),
                            row.get(), recv.empty() ? &dummy : recv.data(), recv_counts.data(),
                            rd.data(), row.get(), comm_),
              "MPI_Alltoallv");
  }
  std::byte* dst = out.numel() > 0 ? out.mutable_data() : nullptr;
  if (forward_direction) {
    for (size_t j = 0; j < recv_index.size(); ++j) {
      std::memcpy(dst + j * rb, recv.data() + static_cast<size_t>(recv_index[j]) * rb, rb);
    }
  } else {
    for (size_t k = 0; k < recv_index.size(); ++k) {
      std::memcpy(dst + static_cast<size_t>(recv_index[k]) * rb, recv.data() + k * rb, rb);
    }
  }
  return out;
}

}  // namespace grouplin
