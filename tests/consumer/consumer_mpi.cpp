// An outside program using grouplin::grouplin_mpi from the installed package: one rank's range of
// experts (no MPI call is made unless it runs under mpirun with an argument).
#include <cstdio>

#include "grouplin/expert_parallel.hpp"

int main(int argc, char** argv) {
  const grouplin::ExpertRange r = grouplin::rank_experts(64, 3, 4);
  std::printf("rank 3 of 4 holds experts [%ld, %ld)\n", static_cast<long>(r.begin),
              static_cast<long>(r.end));
  if (argc > 1) {
    MPI_Init(&argc, &argv);
    {
      const grouplin::ExpertDispatcher d(MPI_COMM_WORLD, 8);
      std::printf("this rank holds experts [%ld, %ld)\n", static_cast<long>(d.experts().begin),
                  static_cast<long>(d.experts().end));
    }
    MPI_Finalize();
  }
  return r.begin == 48 && r.end == 64 ? 0 : 1;
}
