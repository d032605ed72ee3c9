// The fixed pool of threads that runs the tiles of the grouped GEMM kernels.
//
//   const int workers = kernels::workers_for(plan.tasks.size());
//   std::vector<Scratch> scratch(workers);
//   kernels::run_tasks(plan.tasks.size(), workers,
//                      [&](size_t task, int worker) { compute(plan.tasks[task], scratch[worker]);
//                      });
//
// One process-wide pool, created on first use and kept until exit. The thread that calls
// run_tasks works too (as worker 0), so a pool of n threads has n - 1 helpers. Tasks are handed
// out in index order from one atomic counter: a plan sorted largest-first gets largest-first
// dynamic scheduling.
//
// The number of threads never changes results: the kernels tile their work from shapes alone and
// compute every output element in one task, in a fixed order (see grouped_gemm.hpp).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace grouplin::kernels {

// Threads the kernels use, the calling thread included: set_num_threads' value if called, else
// the environment variable GROUPLIN_NUM_THREADS (an integer 1..256) if set, else the number of
// hardware threads. Throws Error(InvalidEnvironment) when GROUPLIN_NUM_THREADS is set to anything
// else.
int num_threads();

// The thread count GROUPLIN_NUM_THREADS=`value` asks for (nullptr: not set, the hardware
// threads). Throws Error(InvalidEnvironment) naming the variable, the value and the range.
int threads_from_environment(const char* value);

// Sets the thread count for later calls (tests and benchmarks compare 1 and 2 threads).
// Throws Error(InvalidArgument) unless 1 <= n <= 256. Thread-safe; a run in progress keeps the
// count it started with.
void set_num_threads(int n);

// The number of workers to use for `count` tasks: min(count, num_threads()), at least 1. Size
// per-worker scratch with it and pass it to run_tasks.
int workers_for(size_t count);

// Calls fn(task, worker) once for every task in [0, count), on up to `workers` threads (the
// calling thread is worker 0), and returns when all calls have returned. Every `worker` passed is
// in [0, workers) and no two calls running at the same time get the same one, so per-worker
// scratch needs no lock. If fn throws, the tasks not yet started are skipped and the first
// exception is rethrown here.
// Thread-safe: when the pool is busy (another thread's run, or a call from inside a task), the
// tasks run on the calling thread alone, as worker 0.
// Requires: workers >= 1.
void run_tasks(size_t count, int workers, const std::function<void(size_t task, int worker)>& fn);

// Runs later calls' tasks on the threads of the OpenMP runtime `library` (a name or path that
// dlopen finds among the libraries already loaded in this process) instead of the pool's own
// helpers; use_own_threads goes back. openmp_threads: the runtime in use, or "" (the pool's own).
// Throws Error(InvalidArgument) naming `library` when it is not loaded or is not an OpenMP
// runtime. grouplin::use_openmp_threads (runtime.hpp) says why.
void use_openmp_threads(const std::string& library);
void use_own_threads();
std::string openmp_threads();

}  // namespace grouplin::kernels
