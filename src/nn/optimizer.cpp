#include "grouplin/optimizer.hpp"

#include <vector>

namespace grouplin {

void sgd_step(Module& module, float lr) {
  std::vector<float> v, g;
  module.for_each_parameter([&](const std::string&, Parameter& p) {
    const Tensor& grad = p.main_grad.defined() ? p.main_grad : p.grad;
    if (!grad.defined()) return;
    Tensor& value = writable_value(p);
    const size_t n = static_cast<size_t>(value.numel());
    v.resize(n);
    g.resize(n);
    convert_elements(value.data(), value.dtype(), v.data(), DType::F32, n);
    convert_elements(grad.data(), grad.dtype(), g.data(), DType::F32, n);
    for (size_t i = 0; i < n; ++i) v[i] -= lr * g[i];
    convert_elements(v.data(), DType::F32, value.mutable_data(), value.dtype(), n);
  });
}

void zero_grad(Module& module) {
  module.for_each_parameter([](const std::string&, Parameter& p) {
    if (p.grad.defined()) p.grad.zero();
    if (p.main_grad.defined()) p.main_grad.zero();
  });
}

}  // namespace grouplin
