// Expert parallelism over MPI (library grouplin_mpi, built when MPI is found: GROUPLIN_WITH_MPI).
// The N experts of a layer are split across the P ranks of a communicator, rank r holding
// experts [r·N/P, (r+1)·N/P); each rank passes its own tokens, which travel to the ranks owning
// their experts by MPI_Alltoallv and come back in the caller's row order.
//
//   grouplin::GroupedLinearOptions o;                        // after MPI_Init:
//   o.num_gemms = 64; o.in_features = 1024; o.out_features = 512;
//   grouplin::ExpertParallelLinear fc(MPI_COMM_WORLD, o);     // 64 / P experts on this rank
//   fc.load("experts.safetensors");                           // reads only this rank's experts
//   grouplin::Tensor x = grouplin::Tensor::zeros({3, 1024}, grouplin::DType::F32);
//   std::vector<int64_t> expert_of_row = {0, 63, 7};          // this rank's tokens
//   grouplin::Tensor y = fc.forward(x, expert_of_row);        // [3, 512], rows in x's order
//   grouplin::Tensor dx = fc.backward(grouplin::Tensor::zeros({3, 512}, grouplin::DType::F32));
//
// Results are bit-identical to one process running all N experts on every rank's tokens (taken
// rank after rank), whatever P: the owner computes each expert's rows in that order (rank 0's
// first, each rank's in its order), and GroupedLinear's bits depend only on values and m_splits.
//
// Every call here is collective: all ranks of the communicator make it, in the same order. What
// one rank gets wrong (a bad shape, an expert index out of range, a dtype other ranks do not
// share, a checkpoint it cannot read) is found before any data moves and thrown on every rank as
// the same Error: its code, and "rank R of P: " + the failing rank's message (the lowest such
// rank); what only the ranks together can see (different dtypes, shapes or options on different
// ranks) is told by every rank from the gathered values, naming the ranks. No rank is left
// waiting in a collective. MPI failures themselves are Error(MpiError)
// (the communicator's errors are returned, not fatal). How to run across hosts, what moves per
// call and how it scales: docs/distributed.md.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

// The experts of rank `rank` of `ranks` under the even split. Throws Error(ExpertsNotDivisible)
// when `experts` is not a multiple of `ranks`, Error(InvalidArgument) for ranks < 1 or a rank
// outside [0, ranks).
ExpertRange rank_experts(int64_t experts, int rank, int ranks);

// Runs `check` on every rank and agrees on the outcome: returns on every rank when no rank's
// check threw a grouplin::Error; otherwise throws on every rank the Error of the lowest failing
// rank (its code and problems, "rank R of P: " before its message). Collective.
void agree_on(MPI_Comm comm, const std::function<void()>& check);

// Moves rows between the ranks that hold them and the ranks that own their experts.
class ExpertDispatcher {
 public:
  // Collective. Works on a duplicate of `comm` (its messages never meet the caller's), with
  // errors returned. Throws Error(ExpertsNotDivisible), and Error(RanksDisagree) when the ranks
  // pass different expert counts.
  ExpertDispatcher(MPI_Comm comm, int64_t num_experts);
  ~ExpertDispatcher();
  ExpertDispatcher(const ExpertDispatcher&) = delete;
  ExpertDispatcher& operator=(const ExpertDispatcher&) = delete;

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  int64_t num_experts() const { return num_experts_; }
  ExpertRange experts() const { return experts_; }  // this rank's
  MPI_Comm comm() const { return comm_; }

  // Collective. Row i of x [T, F] goes to the owner of expert_of_row[i]. Returns this rank's
  // rows [T_local, F]: its experts in order, each expert's rows from rank 0 first and in each
  // rank's own order; local_splits() gives the rows per local expert (GroupedLinear's m_splits).
  // Throws (agreed) Error(ShapeMismatch) when x is not 2-D or expert_of_row.size() is not its
  // row count, Error(OutOfBounds) for an expert index outside [0, N), Error(DTypeMismatch |
  // RanksDisagree) when the ranks' x differ in dtype or features.
  Tensor dispatch(const Tensor& x, std::span<const int64_t> expert_of_row);
  // Rows per local expert of the last dispatch.
  const std::vector<int64_t>& local_splits() const { return local_splits_; }
  // Collective. The rows of `y` [T_local, G] (the last dispatch's order) back to the ranks and
  // rows they came from: [T, G] in the caller's order. Throws (agreed) Error(BackwardBeforeForward)
  // before any dispatch, Error(ShapeMismatch) for a y of another row count.
  Tensor combine(const Tensor& y);
  // Collective. `rows` [T, G] sent as the last dispatch sent x (backward: dy travels the way x
  // did): [T_local, G] in the last dispatch's order. Throws as combine.
  Tensor redispatch(const Tensor& rows);

 private:
  friend class ExpertParallelLinear;
  // dispatch and redispatch with the caller's own checks of the rows, agreed with the others.
  Tensor dispatch_checked(const Tensor& x, std::span<const int64_t> expert_of_row,
                          const std::function<void()>& extra_check);
  Tensor redispatch_checked(const Tensor& rows, const std::function<void()>& extra_check);
  // Moves rows along the last routing: the caller's rows to the owners (forward_direction), or
  // the owners' rows back to their callers.
  Tensor exchange(const Tensor& from, bool forward_direction);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, ranks_ = 1;
  int64_t num_experts_ = 0;
  ExpertRange experts_;
  // The last dispatch's routing.
  bool routed_ = false;
  int64_t rows_ = 0;                        // T: this rank's rows
  std::vector<int64_t> order_;              // sent row k is the caller's row order_[k]
  std::vector<int> send_rows_, recv_rows_;  // per peer
  std::vector<int64_t> local_splits_;
  std::vector<int64_t> local_from_;  // local row j (expert-major) is received row local_from_[j]
};

// One GroupedLinear split across the ranks: this rank's experts in a GroupedLinear of N/P experts
// (any weight layout), tokens moved by an ExpertDispatcher.
class ExpertParallelLinear {
 public:
  // Collective. `options` describe the whole layer (num_gemms = N); the local layer holds this
  // rank's experts, initialised to the values GroupedLinear(options) gives them. Throws as
  // GroupedLinear's constructor and ExpertDispatcher's (agreed), and Error(RanksDisagree) when the
  // ranks' options differ in anything but the weight layout.
  ExpertParallelLinear(MPI_Comm comm, const GroupedLinearOptions& options);

  // Collective. y [T, out] for this rank's x [T, in], row i computed by expert expert_of_row[i].
  // Throws (agreed) as ExpertDispatcher::dispatch, and Error(DTypeMismatch | ShapeMismatch) for x
  // that the layer does not take.
  Tensor forward(const Tensor& x, std::span<const int64_t> expert_of_row);
  // Collective. dx [T, in] for dy [T, out] of the last forward; the local experts' weight and bias
  // gradients are written as GroupedLinear::backward writes them. Throws (agreed)
  // Error(BackwardBeforeForward | ShapeMismatch | DTypeMismatch).
  Tensor backward(const Tensor& dy);

  // Collective. Loads this rank's experts from the checkpoint at `path` (a file or a directory,
  // any format, layout or rule set GroupLin reads), reading only their bytes: options.experts is
  // set to this rank's range (options.model_type, when a fused family needs it, is the
  // caller's: a directory's config.json may name the family its original names came from). All or
  // nothing across ranks: when any rank fails, every rank's layer keeps its values (a rank that
  // had loaded restores them) and every rank throws the same Error.
  LoadReport load(const std::string& path, LoadOptions options = {});

  GroupedLinear& local() { return *local_; }
  const GroupedLinear& local() const { return *local_; }
  ExpertDispatcher& dispatcher() { return dispatcher_; }

 private:
  GroupedLinearOptions options_;
  ExpertDispatcher dispatcher_;
  std::shared_ptr<GroupedLinear> local_;
};

// Collective. Loads this rank's slice into `module` as module.load_state_dict(checkpoint of
// `path`, options) does (options.experts: the rank's range), all or nothing across ranks (see
// ExpertParallelLinear::load; the rank keeps a copy of its module's state while loading).
LoadReport load_experts(MPI_Comm comm, Module& module, const std::string& path,
                        LoadOptions options);

struct ParallelSaveOptions {
  // Where the module's entries go in the checkpoint: "model.layers.0.mlp.experts.".
  std::string prefix{};
  // Tensors that are not experts (rank 0's are written; the others' are ignored).
  StateDict dense{};
  // A directory whose files other than weights and indexes rank 0 copies (config.json, ...).
  std::string copy_files_from{};
  // Replace an existing directory (one that holds only what a save writes: shards, an index and
  // copied files); otherwise an existing `dir` is Error(IoError).
  bool overwrite = false;
};

// Collective. Writes one Hugging Face-style directory: rank r writes the shard
// "model-<r+1>-of-<P>.safetensors" holding its experts of `module` (a GroupedLinear or a tree of
// them, each holding experts [range.begin, range.end) of its layer) renumbered to their global
// indices in the per-expert layout (TransformerEngine names: weight{i}, bias{i}); rank 0 adds the
// rest of the module's entries (_extra_state) and options.dense, writes
// model.safetensors.index.json and copies options.copy_files_from's files. Nothing is visible at
// `dir` until every rank has written its shard: the directory is built beside it and renamed into
// place by rank 0 (ranks must share the filesystem that holds `dir`). Throws (agreed) the first
// failing rank's Error.
void save_experts(MPI_Comm comm, const Module& module, ExpertRange range, const std::string& dir,
                  const ParallelSaveOptions& options = {});

}  // namespace grouplin
