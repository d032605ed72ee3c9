// grouplin._core: GroupLin's library for Python. The package (grouplin/__init__.py) wraps it:
// arrays of any dtype in, NumPy or PyTorch arrays out, keyword arguments with defaults.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "grouplin/version.hpp"

NB_MODULE(_core, m) {
  using namespace grouplin::python;
  m.doc() = "GroupLin's C++ library (the grouplin package wraps it; use that)";
  m.attr("__version__") = std::string(grouplin::version());
  bind_errors(m);
  bind_files(m);
  bind_layer(m);
  bind_gemm(m);
  bind_block(m);
  // Frameworks that keep objects until the process ends (torch's autograd graphs, a layer held
  // by a module-level variable) would make nanobind list them as leaks at exit: noise, not bugs.
  nanobind::set_leak_warnings(false);
}
