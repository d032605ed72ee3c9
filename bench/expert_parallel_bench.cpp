// How much of an expert-parallel layer call is the all-to-all: run under mpirun with P ranks,
// each passing `tokens` rows routed uniformly at random over N experts, it times (best of
// `reps`, the slowest rank's time of each phase) a forward and a backward of
// ExpertParallelLinear, and the same call cut into its phases with a barrier between them:
// dispatch (routing, packing, MPI_Alltoallv of x), the local experts' GroupedLinear, combine
// (MPI_Alltoallv of y back, unpacking). Rank 0 prints one line per phase.
//
//   mpirun -np 4 --oversubscribe build/bench/expert_parallel_bench [experts in out tokens reps]
//
// Defaults: 32 experts of 1024 -> 768 (a qwen3-like expert shrunk to this machine), 2048 tokens
// per rank, BF16, 5 repetitions. The ranks share the machine's cores (GROUPLIN_NUM_THREADS
// splits them), so the compute phase grows with P here where on P machines it would shrink.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "grouplin/expert_parallel.hpp"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The slowest rank's seconds.
double slowest(double seconds) {
  double worst = 0;
  MPI_Allreduce(&seconds, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const int64_t experts = arg(1, 32), in = arg(2, 1024), out = arg(3, 768), tokens = arg(4, 2048);
  const int reps = static_cast<int>(arg(5, 5));
  try {
    grouplin::GroupedLinearOptions o;
    o.num_gemms = experts;
    o.in_features = in;
    o.out_features = out;
    o.params_dtype = grouplin::DType::BF16;
    o.weight_layout = grouplin::WeightLayout::Single;
    grouplin::ExpertParallelLinear ep(MPI_COMM_WORLD, o);
    std::mt19937_64 rng(static_cast<uint64_t>(rank) + 1);
    std::vector<int64_t> route(static_cast<size_t>(tokens));
    for (int64_t& e : route) e = static_cast<int64_t>(rng() % static_cast<uint64_t>(experts));
    std::vector<float> v(static_cast<size_t>(tokens * std::max(in, out)));
    for (float& f : v) f = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
    const auto x = grouplin::Tensor::from_f32(
        {tokens, in}, std::span(v).first(static_cast<size_t>(tokens * in)), o.params_dtype);
    const auto dy = grouplin::Tensor::from_f32(
        {tokens, out}, std::span(v).first(static_cast<size_t>(tokens * out)), o.params_dtype);

    double fwd = 1e30, bwd = 1e30, dispatch = 1e30, compute = 1e30, combine = 1e30;
    for (int r = 0; r < reps + 1; ++r) {  // the first round warms up
      MPI_Barrier(MPI_COMM_WORLD);
      double t = now();
      ep.forward(x, route);
      const double f = slowest(now() - t);
      MPI_Barrier(MPI_COMM_WORLD);
      t = now();
      ep.backward(dy);
      const double b = slowest(now() - t);
      // The forward again, phase by phase.
      grouplin::ExpertDispatcher& d = ep.dispatcher();
      MPI_Barrier(MPI_COMM_WORLD);
      t = now();
      const grouplin::Tensor xs = d.dispatch(x, route);
      const double p1 = slowest(now() - t);
      t = now();
      const grouplin::Tensor ys = ep.local().forward(xs, d.local_splits());
      const double p2 = slowest(now() - t);
      t = now();
      d.combine(ys);
      const double p3 = slowest(now() - t);
      if (r == 0) continue;
      fwd = std::min(fwd, f);
      bwd = std::min(bwd, b);
      dispatch = std::min(dispatch, p1);
      compute = std::min(compute, p2);
      combine = std::min(combine, p3);
    }
    if (rank == 0) {
      const double moved = static_cast<double>(tokens) * static_cast<double>(in + out) * 2 *
                           (ranks - 1) / ranks;  // bytes per rank per forward that leave it
      std::printf("P=%d experts=%ld in=%ld out=%ld tokens/rank=%ld BF16\n", ranks,
                  static_cast<long>(experts), static_cast<long>(in), static_cast<long>(out),
                  static_cast<long>(tokens));
      std::printf("  forward %.2f ms, backward %.2f ms\n", fwd * 1e3, bwd * 1e3);
      const double total = dispatch + compute + combine;
      std::printf(
          "  forward by phase: dispatch %.2f ms (%.0f%%), experts %.2f ms (%.0f%%), "
          "combine %.2f ms (%.0f%%); all-to-all share %.0f%%; %.1f MB leave each rank\n",
          dispatch * 1e3, 100 * dispatch / total, compute * 1e3, 100 * compute / total,
          combine * 1e3, 100 * combine / total, 100 * (dispatch + combine) / total, moved / 1e6);
    }
  } catch (const grouplin::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Finalize();
    return 2;
  }
  MPI_Finalize();
  return 0;
}
