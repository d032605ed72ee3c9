// Expert parallelism under real MPI (run by mpiexec with 1, 2 and 4 ranks: tests/distributed).
// Every test is collective: each rank runs it, and each rank checks its own part against what
// one process computes with all the experts and every rank's tokens (each rank can rebuild every
// other rank's inputs: they are functions of the rank). Checks use EXPECT, never ASSERT, so that
// a failing rank still enters the collectives the others wait in.
#include "grouplin/expert_parallel.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/safetensors.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

int rank_of_world() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int ranks_of_world() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

constexpr int64_t kExperts = 8, kIn = 40, kOut = 24;

GroupedLinearOptions layer_options(DType dt, WeightLayout layout) {
  return testing::gl_options(kExperts, layout, 7, true, dt, kIn, kOut);
}

// A small deterministic generator: values in [-1, 1).
std::vector<float> values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>(static_cast<int64_t>(s >> 40) % 2000) / 1000.0f;
  }
  return v;
}

// Rank r's tokens: its row count, their experts (every path of the kernels: experts with 0, 1,
// a few and many rows), x and dy.
struct Tokens {
  std::vector<int64_t> experts;
  Tensor x, dy;
};
Tokens tokens_of(int r, DType dt) {
  const int64_t rows = 9 + 23 * r;
  Tokens t;
  for (int64_t i = 0; i < rows; ++i) {
    // Expert 3 gets most rows, expert 6 none.
    const int64_t pick = (i * 7 + r * 3) % 11;
    t.experts.push_back(pick >= kExperts ? 3 : (pick == 6 ? 5 : pick));
  }
  t.x = Tensor::from_f32({rows, kIn}, values(static_cast<size_t>(rows * kIn), 100 + r), dt);
  t.dy = Tensor::from_f32({rows, kOut}, values(static_cast<size_t>(rows * kOut), 200 + r), dt);
  return t;
}

// What one process computes with all experts: every rank's rows, rank after rank, grouped by
// expert (stable). `place[r][i]` is where rank r's row i lands.
struct Reference {
  std::shared_ptr<GroupedLinear> layer;
  Tensor y, dx;
  std::vector<std::vector<int64_t>> place;
};
Reference reference(int ranks, DType dt) {
  std::vector<Tokens> all;
  for (int r = 0; r < ranks; ++r) all.push_back(tokens_of(r, dt));
  std::vector<int64_t> splits(kExperts, 0);
  for (const Tokens& t : all) {
    for (int64_t e : t.experts) ++splits[static_cast<size_t>(e)];
  }
  std::vector<int64_t> next(kExperts, 0);
  for (int64_t e = 1; e < kExperts; ++e) next[e] = next[e - 1] + splits[e - 1];
  const int64_t total = std::accumulate(splits.begin(), splits.end(), int64_t{0});
  Reference ref;
  Tensor x = Tensor::zeros({total, kIn}, dt), dy = Tensor::zeros({total, kOut}, dt);
  for (const Tokens& t : all) {
    ref.place.emplace_back();
    for (size_t i = 0; i < t.experts.size(); ++i) {
      const int64_t at = next[static_cast<size_t>(t.experts[i])]++;
      ref.place.back().push_back(at);
      x.select(at).copy_from(t.x.select(static_cast<int64_t>(i)));
      dy.select(at).copy_from(t.dy.select(static_cast<int64_t>(i)));
    }
  }
  ref.layer = std::make_shared<GroupedLinear>(layer_options(dt, WeightLayout::PerExpert));
  ref.y = ref.layer->forward(x, splits);
  ref.dx = ref.layer->backward(dy);
  return ref;
}

// Forward and backward give one process's bits, for every weight layout and dtype: y and dx
// row by row, and the local experts' weight and bias gradients.
TEST(ExpertParallel, ForwardAndBackwardGiveOneProcessBits) {
  const int rank = rank_of_world(), ranks = ranks_of_world();
  for (DType dt : {DType::F32, DType::BF16}) {
    const Reference ref = reference(ranks, dt);
    const Tokens mine = tokens_of(rank, dt);
    for (WeightLayout layout :
         {WeightLayout::PerExpert, WeightLayout::Contiguous, WeightLayout::Single}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::string(layout_name(layout)));
      ExpertParallelLinear ep(MPI_COMM_WORLD, layer_options(dt, layout));
      const ExpertRange range = ep.dispatcher().experts();
      EXPECT_EQ(range.begin, rank * kExperts / ranks);
      const Tensor y = ep.forward(mine.x, mine.experts);
      const Tensor dx = ep.backward(mine.dy);
      for (size_t i = 0; i < mine.experts.size(); ++i) {
        const int64_t at = ref.place[static_cast<size_t>(rank)][i];
        EXPECT_TRUE(y.select(static_cast<int64_t>(i)).bit_equal(ref.y.select(at))) << "y row " << i;
        EXPECT_TRUE(dx.select(static_cast<int64_t>(i)).bit_equal(ref.dx.select(at)))
            << "dx row " << i;
      }
      for (int64_t e = 0; e < range.end - range.begin; ++e) {
        const int64_t g = range.begin + e;
        EXPECT_TRUE(ep.local().expert_weight(e).bit_equal(ref.layer->expert_weight(g))) << g;
        EXPECT_TRUE(ep.local().expert_weight_grad(e).bit_equal(ref.layer->expert_weight_grad(g)))
            << "weight grad of expert " << g;
        EXPECT_TRUE(ep.local().expert_bias_grad(e).bit_equal(ref.layer->expert_bias_grad(g)))
            << "bias grad of expert " << g;
      }
    }
  }
}

// The same Error, code and message, on every rank.
void expect_same_error_everywhere(const std::function<void()>& call, ErrorCode want,
                                  const std::string& failing_rank_says) {
  std::string message = "(no error)";
  ErrorCode code = ErrorCode::InvalidArgument;
  try {
    call();
  } catch (const Error& e) {
    message = e.what();
    code = e.code();
  }
  EXPECT_EQ(error_code_name(code), error_code_name(want)) << message;
  EXPECT_NE(message.find(failing_rank_says), std::string::npos) << message;
  // Rank 0's message, compared on every rank.
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string first(static_cast<size_t>(length), '\0');
  if (rank_of_world() == 0) first = message;
  MPI_Bcast(first.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(message, first);
}

// Bad input on the last rank alone becomes the same named error on every rank, before anything
// moves, and the layer works afterwards.
TEST(ExpertParallel, BadInputOnOneRankIsTheSameErrorOnEveryRank) {
  const int rank = rank_of_world(), ranks = ranks_of_world();
  const bool last = rank == ranks - 1;
  const std::string who = "rank " + std::to_string(ranks - 1) + " of " + std::to_string(ranks);
  ExpertParallelLinear ep(MPI_COMM_WORLD, layer_options(DType::F32, WeightLayout::Single));
  Tokens mine = tokens_of(rank, DType::F32);

  std::vector<int64_t> out_of_range = mine.experts;
  if (last) out_of_range[2] = kExperts;
  expect_same_error_everywhere([&] { ep.forward(mine.x, out_of_range); }, ErrorCode::OutOfBounds,
                               who + ": dispatch: expert_of_row[2] is 8");

  std::vector<int64_t> short_list = mine.experts;
  if (last) short_list.pop_back();
  expect_same_error_everywhere([&] { ep.forward(mine.x, short_list); }, ErrorCode::ShapeMismatch,
                               who + ": dispatch: x has");

  const Tensor wrong_dtype = last ? mine.x.to(DType::BF16) : mine.x;
  expect_same_error_everywhere([&] { ep.forward(wrong_dtype, mine.experts); },
                               ErrorCode::DTypeMismatch, who + ": ExpertParallelLinear: x is BF16");

  // backward before any forward of this layer, on every rank.
  expect_same_error_everywhere([&] { ep.backward(mine.dy); }, ErrorCode::BackwardBeforeForward,
                               "rank 0 of");

  // The dispatcher alone: ranks passing different dtypes (each fine on its own).
  if (ranks > 1) {
    ExpertDispatcher d(MPI_COMM_WORLD, kExperts);
    const Tensor rows = last ? mine.x.to(DType::BF16) : mine.x;
    expect_same_error_everywhere([&] { d.dispatch(rows, mine.experts); }, ErrorCode::DTypeMismatch,
                                 "rank 0 passes F32, rank " + std::to_string(ranks - 1) + " BF16");
    // Experts that do not divide over the ranks, and ranks that disagree on the layer.
    expect_same_error_everywhere([&] { ExpertDispatcher bad(MPI_COMM_WORLD, ranks + 1); },
                                 ErrorCode::ExpertsNotDivisible, "experts over");
    GroupedLinearOptions o = layer_options(DType::F32, WeightLayout::Single);
    if (last) o.in_features = kIn + 1;
    expect_same_error_everywhere([&] { ExpertParallelLinear bad(MPI_COMM_WORLD, o); },
                                 ErrorCode::RanksDisagree, "option in_features");
  }

  // After all that, the layer still runs and gives one process's bits.
  const Reference ref = reference(ranks, DType::F32);
  ExpertParallelLinear ok(MPI_COMM_WORLD, layer_options(DType::F32, WeightLayout::PerExpert));
  const Tensor y = ok.forward(mine.x, mine.experts);
  for (size_t i = 0; i < mine.experts.size(); ++i) {
    EXPECT_TRUE(y.select(static_cast<int64_t>(i))
                    .bit_equal(ref.y.select(ref.place[static_cast<size_t>(rank)][i])));
  }
}

// A directory shared by the ranks, removed at the end (rank 0 creates and removes it).
class SharedDir {
 public:
  SharedDir() {
    std::string path;
    if (rank_of_world() == 0) {
      path = (fs::temp_directory_path() / ("grouplin-ep-" + std::to_string(::getpid()))).string();
      fs::create_directories(path);
    }
    int length = static_cast<int>(path.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(static_cast<size_t>(length));
    MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = path;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_of_world() == 0) fs::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Each rank loads its slice of a whole-layer checkpoint (any layout); a collective save writes one
// sharded directory; that directory loads whole into one process's layer, and as slices of
// another rank count; a checkpoint missing on one rank fails everywhere and changes nothing.
TEST(ExpertParallel, CheckpointsLoadPerRankAndSaveOneDirectory) {
  const int rank = rank_of_world(), ranks = ranks_of_world();
  const SharedDir dir;
  const std::string file = dir.path() + "/layer.safetensors";
  GroupedLinearOptions other = layer_options(DType::BF16, WeightLayout::Single);
  other.seed = 99;  // values unlike the ranks' own initialisation
  const GroupedLinear whole(other);
  if (rank == 0) save_safetensors(file, whole.state_dict("experts."));
  MPI_Barrier(MPI_COMM_WORLD);

  for (WeightLayout layout : {WeightLayout::PerExpert, WeightLayout::Single}) {
    ExpertParallelLinear ep(MPI_COMM_WORLD, layer_options(DType::BF16, layout));
    ep.load(file, {.prefix = "experts."});
    const ExpertRange range = ep.dispatcher().experts();
    for (int64_t e = 0; e < range.end - range.begin; ++e) {
      EXPECT_TRUE(ep.local().expert_weight(e).bit_equal(whole.expert_weight(range.begin + e)));
      EXPECT_TRUE(ep.local().expert_bias(e).bit_equal(whole.expert_bias(range.begin + e)));
    }

    const std::string saved = dir.path() + "/saved-" + std::string(layout_name(layout));
    save_experts(MPI_COMM_WORLD, ep.local(), range, saved, {.prefix = "experts."});
    // One process, all experts.
    GroupedLinear all(layer_options(DType::BF16, WeightLayout::Contiguous));
    all.load_state_dict(load_checkpoint(saved).tensors, {.prefix = "experts."});
    for (int64_t g = 0; g < kExperts; ++g) {
      EXPECT_TRUE(all.expert_weight(g).bit_equal(whole.expert_weight(g))) << g;
      EXPECT_TRUE(all.expert_bias(g).bit_equal(whole.expert_bias(g))) << g;
    }
    // Twice the ranks: this rank's half of its own experts.
    const ExpertRange half = rank_experts(kExperts, 2 * rank + 1, 2 * ranks);
    GroupedLinearOptions ho = layer_options(DType::BF16, WeightLayout::Single);
    ho.num_gemms = half.end - half.begin;
    GroupedLinear part(ho);
    part.load_state_dict(load_checkpoint(saved).tensors, {.prefix = "experts.", .experts = half});
    for (int64_t e = 0; e < ho.num_gemms; ++e) {
      EXPECT_TRUE(part.expert_weight(e).bit_equal(whole.expert_weight(half.begin + e)));
    }
    EXPECT_EQ(fs::exists(saved + "/model.safetensors.index.json"), ranks > 1);
    // Saving over it needs overwrite; without, the same error on every rank.
    expect_same_error_everywhere(
        [&] { save_experts(MPI_COMM_WORLD, ep.local(), range, saved, {.prefix = "experts."}); },
        ErrorCode::IoError, "exists");
    save_experts(MPI_COMM_WORLD, ep.local(), range, saved,
                 {.prefix = "experts.", .overwrite = true});
  }

  // The last rank cannot find its checkpoint: every rank fails, and rank 0's layer, which had
  // loaded, keeps its values.
  ExpertParallelLinear ep(MPI_COMM_WORLD, layer_options(DType::BF16, WeightLayout::PerExpert));
  const Tensor before = ep.local().expert_weight(0).clone();
  const std::string path = rank == ranks - 1 ? dir.path() + "/missing.safetensors" : file;
  expect_same_error_everywhere([&] { ep.load(path, {.prefix = "experts."}); }, ErrorCode::IoError,
                               "rank " + std::to_string(ranks - 1) + " of");
  EXPECT_TRUE(ep.local().expert_weight(0).bit_equal(before));
}

}  // namespace
}  // namespace grouplin
