// grouplin._core.grouped_linear_forward / _backward: the stateless grouped GEMM
// (grouplin/grouped_gemm.hpp) over arrays, without a copy in or out; what grouplin.torch's
// autograd function and the transformers experts backend call.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "grouplin/grouped_gemm.hpp"
#include "grouplin/runtime.hpp"

namespace grouplin::python {

ExpertWeights experts_from_arrays(const std::vector<InArray>& weights,
                                  const std::optional<std::string>& weight_dtype,
                                  const std::vector<InArray>& scales,
                                  const std::vector<InArray>& biases,
                                  const std::optional<std::string>& bias_dtype) {
  auto tensors = [](const std::vector<InArray>& arrays, const std::optional<std::string>& dtype,
                    const char* what) {
    std::vector<Tensor> out;
    for (const InArray& a : arrays) out.push_back(tensor_from_array(a, dtype, what));
    return out;
  };
  // One stacked tensor (rank `stacked`) stands for its experts' views; each list on its own (a
  // module's biases may be stacked while its weights are not).
  auto per_expert = [](std::vector<Tensor> ts, size_t stacked) {
    if (ts.size() != 1 || ts[0].rank() != stacked) return ts;
    std::vector<Tensor> views;
    for (int64_t i = 0; i < ts[0].dim(0); ++i) views.push_back(ts[0].select(i));
    return views;
  };
  return ExpertWeights{per_expert(tensors(weights, weight_dtype, "weight"), 3),
                       per_expert(tensors(scales, std::nullopt, "weight_scale_inv"), 3),
                       per_expert(tensors(biases, bias_dtype, "bias"), 2)};
}

namespace {

nb::object forward(const InArray& x, const std::optional<std::string>& x_dtype,
                   const std::vector<int64_t>& m_splits, const std::vector<InArray>& weight,
                   const std::optional<std::string>& weight_dtype,
                   const std::vector<InArray>& scales, const std::vector<InArray>& bias,
                   const std::optional<std::string>& bias_dtype, const std::string& framework) {
  const Framework f = framework_from_name(framework);
  const Tensor in = tensor_from_array(x, x_dtype, "x");
  const ExpertWeights w = experts_from_arrays(weight, weight_dtype, scales, bias, bias_dtype);
  Tensor y;
  {
    nb::gil_scoped_release unlocked;
    y = grouped_linear_forward(in, m_splits, w);
  }
  return array_from_tensor(y, f);
}

nb::tuple backward(const InArray& x, const std::optional<std::string>& x_dtype, const InArray& dy,
                   const std::vector<int64_t>& m_splits, const std::vector<InArray>& weight,
                   const std::optional<std::string>& weight_dtype,
                   const std::vector<InArray>& scales, const std::vector<InArray>& bias,
                   const std::optional<std::string>& bias_dtype, bool dx, bool dw, bool db,
                   const std::string& framework) {
  const Framework f = framework_from_name(framework);
  const Tensor in = tensor_from_array(x, x_dtype, "x");
  const Tensor grad = tensor_from_array(dy, x_dtype, "dy");
  const ExpertWeights w = experts_from_arrays(weight, weight_dtype, scales, bias, bias_dtype);
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
        nb::arg("m_splits"), nb::arg("weight"), nb::arg("weight_dtype").none(), nb::arg("scales"),
        nb::arg("bias"), nb::arg("bias_dtype").none(), nb::arg("framework"),
        "y [T, out] = x [T, in] split by m_splits times each expert's weight^T plus its bias; "
        "weight: [one [N, out, in] array] or N [out, in] arrays (scales and bias alike, or "
        "empty); nothing is kept.");
  m.def("grouped_linear_backward", &backward, nb::arg("x"), nb::arg("x_dtype").none(),
        nb::arg("dy"), nb::arg("m_splits"), nb::arg("weight"), nb::arg("weight_dtype").none(),
        nb::arg("scales"), nb::arg("bias"), nb::arg("bias_dtype").none(), nb::arg("dx"),
        nb::arg("dw"), nb::arg("db"), nb::arg("framework"),
        "(dx [T, in], dw [N, out, in], db [N, out]) of grouped_linear_forward for dy [T, out]; "
        "None for what is not asked for.");
  m.def("use_openmp_threads", &use_openmp_threads, nb::arg("library"),
        "Runs the kernels' parallel work on the threads of this already loaded OpenMP runtime.");
  m.def("use_own_threads", &use_own_threads,
        "Runs the kernels' parallel work on GroupLin's own "
        "threads (the default).");
  m.def("openmp_threads", &openmp_threads,
        "The OpenMP runtime the kernels run on, or \"\" for GroupLin's own threads.");
}

}  // namespace grouplin::python
