// Process-wide settings of GroupLin's kernels.
//
//   grouplin::set_num_threads(8);         // or GROUPLIN_NUM_THREADS=8 in the environment
//   int n = grouplin::num_threads();      // 8
//   std::string isa = grouplin::kernel_isa();  // e.g. "avx2"; GROUPLIN_ISA=portable caps it
//
// The number of threads never changes results: every output element is computed by one thread
// in a fixed order, so 1, 2 or 64 threads give the same bits.
#pragma once

#include <string>

namespace grouplin {

// Threads the kernels use, the calling thread included: set_num_threads' value if it was called,
// else the environment variable GROUPLIN_NUM_THREADS (an integer 1..256) if set, else the number
// of hardware threads. Throws Error(InvalidEnvironment) when GROUPLIN_NUM_THREADS is set to
// anything else.
int num_threads();

// Sets the thread count for later calls. Throws Error(InvalidArgument) unless 1 <= n <= 256.
// Thread-safe; a call in progress keeps the count it started with.
void set_num_threads(int n);

// Runs the kernels' parallel work on the threads of an OpenMP runtime already loaded in this
// process instead of GroupLin's own: `library` is its name or path as dlopen finds it among the
// loaded libraries (e.g. the path /proc/self/maps gives for PyTorch's libgomp.so.1). For a
// process where another library's OpenMP threads run between GroupLin's calls (PyTorch's ops):
// they keep spinning for a while after each of their parallel regions, on the cores GroupLin's
// own threads would need, and their team takes GroupLin's tasks at once instead. Any runtime with
// the GNU OpenMP ABI (GOMP_parallel, omp_get_thread_num: GCC's libgomp; LLVM's and Intel's
// runtimes export it too). num_threads() still sets how many threads a call uses; results are
// the same bits either way. Throws Error(InvalidArgument) naming `library` when it is not loaded
// or is not an OpenMP runtime (nothing changes then). Thread-safe; a call in progress finishes
// on the threads it started with.
void use_openmp_threads(const std::string& library);
// Back to GroupLin's own threads (the default).
void use_own_threads();
// The OpenMP runtime the kernels run on (as given to use_openmp_threads), or "" for their own.
std::string openmp_threads();

// The instruction set the kernels run on: "portable", "avx2", "avx512", "avx512bf16" or "amx",
// the most capable set (in that order, each implying the ones before) that the CPU and the OS
// offer and that the environment variable GROUPLIN_ISA, one of those names, allows
// (GROUPLIN_ISA=avx2 runs the avx2 kernels on an AMX machine); "portable" in builds for other
// architectures than x86-64. Decided once per process, at the first call of this function or of a
// kernel (GroupedLinear::forward, backward). Throws Error(InvalidEnvironment) naming the variable,
// its value and the five accepted names when GROUPLIN_ISA is anything else: that first call and
// every later one throw it, and the variable is not read again. Call it at startup to report a bad
// value before any work (the grouplin command does).
std::string kernel_isa();

// What the CPU and OS offer, for reports: "avx2 fma avx512f avx512_bf16 amx_bf16" (the AMX tile
// state is requested from Linux; "(amx refused by the OS)" when it says no).
std::string cpu_features();

}  // namespace grouplin
