// grouplin._core.expert_block_forward / _backward: the expert block (grouplin/expert_block.hpp)
// over arrays, without a copy in or out; what the transformers experts backend calls. The gate is
// named by strings, the forward's saved routing is an opaque ExpertBlockSaved object.
#include <nanobind/stl/tuple.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "grouplin/error.hpp"
#include "grouplin/expert_block.hpp"

namespace grouplin::python {
namespace {

// (kind, activation, interleaved, limit, alpha); kind: "none", "multiply", "clamp_before",
// "clamp_after", "glu_plus_one"; activation: "silu", "gelu", "gelu_tanh", "relu", "relu2".
using GateArgs = std::tuple<std::string, std::string, bool, std::optional<double>, double>;

ExpertGate gate_from(const GateArgs& args) {
  const auto& [kind, activation, interleaved, limit, alpha] = args;
  ExpertGate g;
  static const std::pair<const char*, ExpertGateKind> kinds[] = {
      {"none", ExpertGateKind::None},
      {"multiply", ExpertGateKind::Multiply},
      {"clamp_before", ExpertGateKind::ClampBefore},
      {"clamp_after", ExpertGateKind::ClampAfter},
      {"glu_plus_one", ExpertGateKind::GluPlusOne}};
  static const std::pair<const char*, ExpertActivation> activations[] = {
      {"silu", ExpertActivation::SiLU},
      {"gelu", ExpertActivation::GELU},
      {"gelu_tanh", ExpertActivation::GELUTanh},
      {"relu", ExpertActivation::ReLU},
      {"relu2", ExpertActivation::ReLU2}};
  auto pick = [](const auto& table, const std::string& name, const char* what) {
    std::string known;
    for (const auto& [n, v] : table) {
      if (name == n) return v;
      known += known.empty() ? n : std::string(", ") + n;
    }
    throw Error(ErrorCode::InvalidArgument, std::string("expert block gate: ") + what + " '" +
                                                name + "', expected one of " + known);
  };
  g.kind = pick(kinds, kind, "kind");
  g.activation = pick(activations, activation, "activation");
  g.interleaved = interleaved;
  g.limit = limit ? static_cast<float>(*limit) : INFINITY;
  g.alpha = static_cast<float>(alpha);
  return g;
}

struct BlockArrays {
  std::vector<InArray> first, first_scales, first_bias, down, down_scales, down_bias;
};

ExpertBlockWeights weights_from(const BlockArrays& a,
                                const std::optional<std::string>& weight_dtype,
                                const std::optional<std::string>& bias_dtype, bool transposed) {
  return {experts_from_arrays(a.first, weight_dtype, a.first_scales, a.first_bias, bias_dtype),
          experts_from_arrays(a.down, weight_dtype, a.down_scales, a.down_bias, bias_dtype),
          transposed};
}

nb::tuple forward(const InArray& hidden, const std::optional<std::string>& hidden_dtype,
                  const InArray& top_k_index, const InArray& top_k_weights,
                  const std::optional<std::string>& routing_dtype, const BlockArrays& arrays,
                  const std::optional<std::string>& weight_dtype,
                  const std::optional<std::string>& bias_dtype, bool transposed,
                  const GateArgs& gate, bool save, const std::string& framework) {
  const Framework f = framework_from_name(framework);
  const Tensor h = tensor_from_array(hidden, hidden_dtype, "hidden_states");
  const Tensor index = tensor_from_array(top_k_index, std::nullopt, "top_k_index");
  const Tensor routing = tensor_from_array(top_k_weights, routing_dtype, "top_k_weights");
  const ExpertBlockWeights w = weights_from(arrays, weight_dtype, bias_dtype, transposed);
  const ExpertGate g = gate_from(gate);
  ExpertBlockResult r;
  {
    nb::gil_scoped_release unlocked;
    r = expert_block_forward(h, index, routing, w, g, save);
  }
  nb::object saved = save ? nb::cast(std::move(r.saved)) : nb::none();
  return nb::make_tuple(array_from_tensor(r.out, f), saved);
}

nb::tuple backward(const InArray& d_out, const InArray& hidden,
                   const std::optional<std::string>& hidden_dtype, const InArray& top_k_weights,
                   const std::optional<std::string>& routing_dtype, const BlockArrays& arrays,
                   const std::optional<std::string>& weight_dtype,
                   const std::optional<std::string>& bias_dtype, bool transposed,
                   const GateArgs& gate, const ExpertBlockSaved& saved,
                   std::tuple<bool, bool, bool, bool> wanted, const std::string& framework) {
  const Framework f = framework_from_name(framework);
  const Tensor grad = tensor_from_array(d_out, hidden_dtype, "d_out");
  const Tensor h = tensor_from_array(hidden, hidden_dtype, "hidden_states");
  const Tensor routing = tensor_from_array(top_k_weights, routing_dtype, "top_k_weights");
  const ExpertBlockWeights w = weights_from(arrays, weight_dtype, bias_dtype, transposed);
  const ExpertGate g = gate_from(gate);
  const auto [d_hidden, d_routing, d_weights, d_biases] = wanted;
  ExpertBlockGrads r;
  {
    nb::gil_scoped_release unlocked;
    r = expert_block_backward(
        grad, h, routing, w, g, saved,
        {.hidden = d_hidden, .top_k_weights = d_routing, .weights = d_weights, .biases = d_biases});
  }
  return nb::make_tuple(array_from_tensor(r.hidden, f), array_from_tensor(r.top_k_weights, f),
                        array_from_tensor(r.first, f), array_from_tensor(r.first_bias, f),
                        array_from_tensor(r.down, f), array_from_tensor(r.down_bias, f));
}

}  // namespace

void bind_block(nb::module_& m) {
  nb::class_<ExpertBlockSaved>(m, "ExpertBlockSaved",
                               "What an expert block forward keeps for its backward (opaque)");
  nb::class_<BlockArrays>(m, "ExpertBlockArrays",
                          "The two projections' arrays: lists of one stacked array or one per "
                          "expert (scales and biases may be empty)")
      .def(nb::init<std::vector<InArray>, std::vector<InArray>, std::vector<InArray>,
                    std::vector<InArray>, std::vector<InArray>, std::vector<InArray>>(),
           nb::arg("first"), nb::arg("first_scales"), nb::arg("first_bias"), nb::arg("down"),
           nb::arg("down_scales"), nb::arg("down_bias"));
  m.def("expert_block_forward", &forward, nb::arg("hidden"), nb::arg("hidden_dtype").none(),
        nb::arg("top_k_index"), nb::arg("top_k_weights"), nb::arg("routing_dtype").none(),
        nb::arg("weights"), nb::arg("weight_dtype").none(), nb::arg("bias_dtype").none(),
        nb::arg("transposed"), nb::arg("gate"), nb::arg("save"), nb::arg("framework"),
        "(out [T, H], saved or None): the experts of one MoE layer for hidden [T, H], "
        "top_k_index and top_k_weights [T, K]; gate = (kind, activation, interleaved, limit or "
        "None, alpha).");
  m.def("expert_block_backward", &backward, nb::arg("d_out"), nb::arg("hidden"),
        nb::arg("hidden_dtype").none(), nb::arg("top_k_weights"), nb::arg("routing_dtype").none(),
        nb::arg("weights"), nb::arg("weight_dtype").none(), nb::arg("bias_dtype").none(),
        nb::arg("transposed"), nb::arg("gate"), nb::arg("saved"), nb::arg("wanted"),
        nb::arg("framework"),
        "(d hidden, d top_k_weights, d first, d first bias, d down, d down bias) of "
        "expert_block_forward for d_out [T, H]; None for what is not wanted; wanted = (hidden, "
        "top_k_weights, weights, biases).");
}

}  // namespace grouplin::python
