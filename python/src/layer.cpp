// grouplin.GroupedLinear from Python. One layer object may be used from several threads: its
// calls are serialized by a lock, taken after the interpreter lock is released (so a thread
// waiting for the layer never holds up the others), and released before results are built.

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "bindings.hpp"
#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/load_state_dict.hpp"

namespace grouplin::python {
namespace {

DType dtype_option(const std::string& name, const char* what) {
  const std::optional<DType> t = dtype_from_name(name);
  if (!t) {
    throw Error(ErrorCode::UnsupportedDType, std::string(what) + " " + quote(name) +
                                                 ": expected \"F32\", \"BF16\" or \"F8_E4M3\"");
  }
  return *t;
}

std::optional<WeightLayout> layout_option(const std::optional<std::string>& name,
                                          const char* what) {
  if (!name) return std::nullopt;
  const std::optional<WeightLayout> l = weight_layout_from_name(*name);
  if (!l) {
    throw Error(ErrorCode::InvalidArgument,
                std::string(what) + " " + quote(*name) +
                    ": expected \"per-expert\", \"contiguous\" or \"single\"");
  }
  return l;
}

class Layer {
 public:
  Layer(int64_t num_gemms, int64_t in_features, int64_t out_features, bool bias,
        const std::string& params_dtype, const std::optional<std::string>& activation_dtype,
        const std::optional<std::string>& weight_layout,
        const std::optional<std::string>& bias_layout, uint64_t seed,
        bool fuse_wgrad_accumulation) {
    GroupedLinearOptions o;
    o.num_gemms = num_gemms;
    o.in_features = in_features;
    o.out_features = out_features;
    o.bias = bias;
    o.params_dtype = dtype_option(params_dtype, "params_dtype");
    if (activation_dtype) o.activation_dtype = dtype_option(*activation_dtype, "activation_dtype");
    o.weight_layout = layout_option(weight_layout, "weight_layout");
    o.bias_layout = layout_option(bias_layout, "bias_layout");
    o.seed = seed;
    o.fuse_wgrad_accumulation = fuse_wgrad_accumulation;
    nb::gil_scoped_release unlocked;
    layer_ = std::make_unique<GroupedLinear>(o);
  }

  nb::object forward(const InArray& x, const std::optional<std::string>& dtype,
                     const std::vector<int64_t>& m_splits, const std::string& framework) {
    const Framework f = framework_from_name(framework);
    const Tensor input = tensor_from_array(x, dtype, "x");
    Tensor y;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard<std::mutex> lock(mu_);
      y = layer_->forward(input, m_splits);  // keeps `input`, and so x, alive for backward
      ++forwards_;
    }
    return array_from_tensor(y, f);
  }

  nb::object backward(const InArray& dy, const std::optional<std::string>& dtype,
                      const std::string& framework) {
    const Framework f = framework_from_name(framework);
    const Tensor grad = tensor_from_array(dy, dtype, "dy");
    Tensor dx;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard<std::mutex> lock(mu_);
      dx = layer_->backward(grad);
    }
    return array_from_tensor(dx, f);
  }

  void set_weight_packing(bool on) {
    nb::gil_scoped_release unlocked;
    std::lock_guard<std::mutex> lock(mu_);
    layer_->set_weight_packing(on);
  }
  bool weight_packing() {
    std::lock_guard<std::mutex> lock(mu_);
    return layer_->weight_packing();
  }
  size_t packed_weight_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return layer_->packed_weight_bytes();
  }
  void mark_weights_written() {
    nb::gil_scoped_release unlocked;
    std::lock_guard<std::mutex> lock(mu_);
    layer_->mark_weights_written();
  }

  // A tensor read under the layer's lock (a load may be replacing it meanwhile).
  template <class Read>
  nb::object locked_view(Read read, const std::string& framework) {
    const Framework f = framework_from_name(framework);
    Tensor t;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard<std::mutex> lock(mu_);
      t = read(*layer_);
    }
    return array_from_tensor(t, f);
  }

  nb::list parameters(const std::string& framework) {
    const Framework f = framework_from_name(framework);
    std::vector<Parameter> params;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard<std::mutex> lock(mu_);
      params = layer_->parameters();
    }
    nb::list out;
    for (const Parameter& p : params) {
      out.append(
          nb::make_tuple(p.name, array_from_tensor(p.value, f), array_from_tensor(p.grad, f)));
    }
    return out;
  }

  nb::list state_dict(const std::string& prefix, const std::string& framework) {
    const Framework f = framework_from_name(framework);
    StateDict sd;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard<std::mutex> lock(mu_);
      sd = layer_->state_dict(prefix);
    }
    return arrays_from_state_dict(sd, f);
  }

  nb::dict load_state_dict(const std::vector<std::string>& names,
                           const std::vector<InArray>& arrays,
                           const std::vector<std::optional<std::string>>& dtypes, bool strict,
                           const std::string& prefix, const std::vector<std::string>& rules,
                           const std::string& model_type) {
    const StateDict source = state_dict_from_arrays(names, arrays, dtypes);
    LoadOptions o;
    o.strict = strict;
    o.prefix = prefix;
    o.rules = rules_from_names(rules);
    o.model_type = model_type;
    LoadReport r;
    {
      nb::gil_scoped_release unlocked;
      std::lock_guard<std::mutex> lock(mu_);
      r = layer_->load_state_dict(source, o);  // copies: the layer keeps no view of the arrays
    }
    nb::dict d;
    d["loaded"] = r.loaded;
    d["missing"] = r.missing;
    d["unexpected"] = r.unexpected;
    d["absent"] = r.absent;
    nb::list conversions;
    for (const LayoutConversion& c : r.layout_conversions) {
      conversions.append(nb::make_tuple(c.module, std::string(layout_name(c.from)),
                                        std::string(layout_name(c.to))));
    }
    d["layout_conversions"] = conversions;
    return d;
  }

  const GroupedLinearOptions& options() const { return layer_->options(); }
  std::string weight_layout() const { return std::string(layout_name(layer_->layout())); }
  std::string bias_layout() const { return std::string(layout_name(layer_->bias_layout())); }
  std::string activation_dtype() const {
    return std::string(dtype_name(layer_->activation_dtype()));
  }
  uint64_t forwards() const { return forwards_; }

 private:
  std::mutex mu_;
  std::unique_ptr<GroupedLinear> layer_;
  uint64_t forwards_ = 0;  // forward calls so far: which one backward would differentiate
};

// Expert i's tensors, each a method taking (i, framework).
struct ExpertView {
  const char* name;
  Tensor (GroupedLinear::*get)(int64_t) const;
  const char* doc;
};
constexpr ExpertView kExpertViews[] = {
    {"expert_weight", &GroupedLinear::expert_weight, "View of expert i's weight [out, in]."},
    {"expert_weight_scale", &GroupedLinear::expert_weight_scale,
     "View of expert i's FP8 block scales, or None."},
    {"expert_bias", &GroupedLinear::expert_bias, "View of expert i's bias [out], or None."},
    {"expert_weight_grad", &GroupedLinear::expert_weight_grad,
     "View of expert i's weight gradient, or None."},
    {"expert_bias_grad", &GroupedLinear::expert_bias_grad,
     "View of expert i's bias gradient, or None."},
};

}  // namespace

void bind_layer(nb::module_& m) {
  auto cls = nb::class_<Layer>(m, "GroupedLinear",
                               "N experts: y_i = x_i W_i^T + b_i over rows split by m_splits.");
  for (const ExpertView& v : kExpertViews) {
    const auto get = v.get;
    cls.def(
        v.name,
        [get](Layer& l, int64_t i, const std::string& f) {
          return l.locked_view([get, i](GroupedLinear& g) { return (g.*get)(i); }, f);
        },
        nb::arg("i"), nb::arg("framework"), v.doc);
  }
  cls.def(nb::init<int64_t, int64_t, int64_t, bool, const std::string&,
                   const std::optional<std::string>&, const std::optional<std::string>&,
                   const std::optional<std::string>&, uint64_t, bool>(),
          nb::arg("num_gemms"), nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias"),
          nb::arg("params_dtype"), nb::arg("activation_dtype").none(),
          nb::arg("weight_layout").none(), nb::arg("bias_layout").none(), nb::arg("seed"),
          nb::arg("fuse_wgrad_accumulation"))
      .def("forward", &Layer::forward, nb::arg("x"), nb::arg("dtype").none(), nb::arg("m_splits"),
           nb::arg("framework"), "y [T, out] for x [T, in]; keeps x for backward.")
      .def("backward", &Layer::backward, nb::arg("dy"), nb::arg("dtype").none(),
           nb::arg("framework"), "dx [T, in] for dy [T, out]; fills the gradients.")
      .def("set_weight_packing", &Layer::set_weight_packing, nb::arg("on"),
           "Forward reads the weights from a packed copy (GroupedLinear::set_weight_packing).")
      .def("mark_weights_written", &Layer::mark_weights_written,
           "The weights were written through views: the next forward packs them again.")
      .def_prop_ro("weight_packing", &Layer::weight_packing, "Whether weight packing is on.")
      .def_prop_ro("packed_weight_bytes", &Layer::packed_weight_bytes,
                   "Bytes of the packed copy (0 where the kernels would not read one).")
      .def("parameters", &Layer::parameters, nb::arg("framework"),
           "[(name, value view, grad view or None)] in registration order.")
      .def("state_dict", &Layer::state_dict, nb::arg("prefix"), nb::arg("framework"),
           "[(name, dtype, view)]: parameters and buffers.")
      .def("load_state_dict", &Layer::load_state_dict, nb::arg("names"), nb::arg("arrays"),
           nb::arg("dtypes"), nb::arg("strict"), nb::arg("prefix"), nb::arg("rules"),
           nb::arg("model_type"), "Loads entries of any layout; the report as a dict.")
      .def_prop_ro(
          "num_gemms", [](const Layer& l) { return l.options().num_gemms; },
          "N, the number of experts.")
      .def_prop_ro(
          "in_features", [](const Layer& l) { return l.options().in_features; }, "Columns of x.")
      .def_prop_ro(
          "out_features", [](const Layer& l) { return l.options().out_features; }, "Columns of y.")
      .def_prop_ro(
          "bias", [](const Layer& l) { return l.options().bias; }, "Whether experts have biases.")
      .def_prop_ro(
          "params_dtype",
          [](const Layer& l) { return std::string(dtype_name(l.options().params_dtype)); },
          "The weights' dtype: \"F32\", \"BF16\" or \"F8_E4M3\".")
      .def_prop_ro("activation_dtype", &Layer::activation_dtype,
                   "The dtype of x, y, dy, dx and the biases.")
      .def_prop_ro("weight_layout", &Layer::weight_layout,
                   "\"per-expert\", \"contiguous\" or \"single\".")
      .def_prop_ro("bias_layout", &Layer::bias_layout, "The biases' layout.")
      .def_prop_ro("forwards", &Layer::forwards,
                   "Forward calls so far (backward differentiates the last one).");
}

}  // namespace grouplin::python
