// The public face of the kernels' settings (include/grouplin/runtime.hpp).
#include "grouplin/runtime.hpp"

#include "kernels/isa.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin {

int num_threads() { return kernels::num_threads(); }

void set_num_threads(int n) { kernels::set_num_threads(n); }

std::string kernel_isa() { return std::string(kernels::isa_name(kernels::kernel_isa())); }

std::string cpu_features() { return kernels::describe(kernels::detect_cpu()); }

}  // namespace grouplin
