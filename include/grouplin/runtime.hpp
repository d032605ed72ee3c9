// Process-wide settings of GroupLin's kernels.
//
//   grouplin::set_num_threads(8);         // or GROUPLIN_NUM_THREADS=8 in the environment
//   int n = grouplin::num_threads();      // 8
//
// The number of threads never changes results: every output element is computed by one thread
// in a fixed order, so 1, 2 or 64 threads give the same bits.
#pragma once

namespace grouplin {

// Threads the kernels use, the calling thread included: set_num_threads' value if it was called,
// else the environment variable GROUPLIN_NUM_THREADS (an integer 1..256) if set, else the number
// of hardware threads. Throws Error(InvalidEnvironment) when GROUPLIN_NUM_THREADS is set to
// anything else.
int num_threads();

// Sets the thread count for later calls. Throws Error(InvalidArgument) unless 1 <= n <= 256.
// Thread-safe; a call in progress keeps the count it started with.
void set_num_threads(int n);

}  // namespace grouplin
