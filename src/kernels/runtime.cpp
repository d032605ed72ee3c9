// The public face of the kernels' settings (include/grouplin/runtime.hpp).
#include "grouplin/runtime.hpp"

#include "kernels/isa.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin {

int num_threads() { return kernels::num_threads(); }

void set_num_threads(int n) { kernels::set_num_threads(n); }

void use_openmp_threads(const std::string& library) { kernels::use_openmp_threads(library); }

void use_own_threads() { kernels::use_own_threads(); }

std::string openmp_threads() { return kernels::openmp_threads(); }

std::string kernel_isa() { return std::string(kernels::isa_name(kernels::kernel_isa())); }

std::string cpu_features() { return kernels::describe(kernels::detect_cpu()); }

}  // namespace grouplin
