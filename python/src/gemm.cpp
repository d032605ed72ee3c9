// grouplin._core.grouped_linear_forward / _backward: the stateless grouped GEMM
// (grouplin/grouped_gemm.hpp) over arrays, without a copy in or out; what grouplin.torch's
// autograd function and the transformers experts backend call.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "grouplin/grouped_gemm.hpp"

namespace grouplin::python {
namespace {

// An optional array (None) with its GroupLin dtype, as a tensor (undefined for None).
Tensor optional_tensor(const std::optional<InArray>& a, const std::optional<std::string>& dtype,
                       const char* what) {
  return a ? tensor_from_array(*a, dtype, what) : Tensor();
}

ExpertWeights experts(const InArray& weight, const std::optional<std::string>& weight_dtype,
                      const std::optional<InArray>& scales, const std::optional<InArray>& bias,
                      const std::optional<std::string>& bias_dtype) {
  return ExpertWeights::stacked(tensor_from_array(weight, weight_dtype, "weight"),
                                optional_tensor(scales, std::nullopt, "scales"),
                                optional_tensor(bias, bias_dtype, "bias"));
}

nb::object forward(const InArray& x, const std::optional<std::string>& x_dtype,
                   const std::vector<int64_t>& m_splits, const InArray& weight,
                   const std::optional<std::string>& weight_dtype,
                   const std::optional<InArray>& scales, const std::optional<InArray>& bias,
                   const std::optional<std::string>& bias_dtype, const std::string& framework) {
  const Framework f = framework_from_name(framework);
  const Tensor in = tensor_from_array(x, x_dtype, "x");
  const ExpertWeights w = experts(weight, weight_dtype, scales, bias, bias_dtype);
  Tensor y;
  {
    nb::gil_scoped_release unlocked;
    y = grouped_linear_forward(in, m_splits, w);
  }
  return array_from_tensor(y, f);
}

nb::tuple backward(const InArray& x, const std::optional<std::string>& x_dtype, const InArray& dy,
                   const std::vector<int64_t>& m_splits, const InArray& weight,
                   const std::optional<std::string>& weight_dtype,
                   const std::optional<InArray>& scales, const std::optional<InArray>& bias,
                   const std::optional<std::string>& bias_dtype, bool dx, bool dw, bool db,
                   const std::string& framework) {
  const Framework f = framework_from_name(framework);
  const Tensor in = tensor_from_array(x, x_dtype, "x");
  const Tensor grad = tensor_from_array(dy, x_dtype, "dy");
  const ExpertWeights w = experts(weight, weight_dtype, scales, bias, bias_dtype);
  GroupedGrads g;
  {
    nb::gil_scoped_release unlocked;
    g = grouped_linear_backward(in, grad, m_splits, w, {.dx = dx, .dw = dw, .db = db});
  }
  return nb::make_tuple(array_from_tensor(g.dx, f), array_from_tensor(g.dw, f),
                        array_from_tensor(g.db, f));
}

}  // namespace

void bind_gemm(nb::module_& m) {
  m.def("grouped_linear_forward", &forward, nb::arg("x"), nb::arg("x_dtype").none(),
        nb::arg("m_splits"), nb::arg("weight"), nb::arg("weight_dtype").none(),
        nb::arg("scales").none(), nb::arg("bias").none(), nb::arg("bias_dtype").none(),
        nb::arg("framework"),
        "y [T, out] = x [T, in] split by m_splits times each expert's weight [N, out, in]^T, "
        "plus its bias [N, out]; nothing is kept.");
  m.def("grouped_linear_backward", &backward, nb::arg("x"), nb::arg("x_dtype").none(),
        nb::arg("dy"), nb::arg("m_splits"), nb::arg("weight"), nb::arg("weight_dtype").none(),
        nb::arg("scales").none(), nb::arg("bias").none(), nb::arg("bias_dtype").none(),
        nb::arg("dx"), nb::arg("dw"), nb::arg("db"), nb::arg("framework"),
        "(dx [T, in], dw [N, out, in], db [N, out]) of grouped_linear_forward for dy [T, out]; "
        "None for what is not asked for.");
}

}  // namespace grouplin::python
