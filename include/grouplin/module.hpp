// Module: a node of a model tree with named parameters, buffers and children.
//
//   auto model = std::make_shared<grouplin::Sequential>();
//   model->add_child("decoder", std::make_shared<grouplin::Sequential>());  // a GroupedLinear...
//   grouplin::StateDict sd = model->state_dict();   // "decoder.fc1.weight0", ...
//   grouplin::LoadReport r = model->load_state_dict(sd, {.strict = true});  // any layout
//   std::cout << r.loaded.size() << " entries loaded\n";
//
// Parameter and buffer names are local ("weight3"); state dicts use dotted paths
// ("decoder.layers.0.fc1.weight3"). Not thread-safe: one thread uses a module at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grouplin/load_state_dict.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

class LoadPlan;    // module_extension.hpp, for authors of modules
class LoadSource;  // module_extension.hpp

// One trainable tensor with its gradients.
struct Parameter {
  std::string name;  // local name, e.g. "weight3"
  Tensor value;
  Tensor grad;       // params dtype; written by backward (undefined before the first one)
  Tensor main_grad;  // F32; accumulated by backward with fuse_wgrad_accumulation
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // This module's own parameters, in registration order.
  const std::vector<Parameter>& parameters() const { return params_; }
  // This module's own buffers (saved in state dicts, not trained), in registration order.
  const std::vector<std::pair<std::string, Tensor>>& buffers() const { return buffers_; }
  // Children in insertion order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }

  // Adds a child. Throws Error(DuplicateName) if the name is taken or InvalidArgument if it is
  // empty or contains '.'.
  void add_child(std::string name, std::shared_ptr<Module> child);
  // The child with this name; throws Error(MissingKey).
  Module& child(std::string_view name) const;

  // The parameter at a dotted path below this module ("layers.0.fc1.weight3").
  // Throws Error(MissingKey) naming the path.
  const Parameter& parameter(std::string_view dotted_name) const;
  // Visits every parameter of the tree (this module first, then children in order) with its
  // dotted name. The callback may modify the parameter's tensors' bytes through
  // writable_value() below.
  void for_each_parameter(const std::function<void(const std::string&, Parameter&)>& fn,
                          const std::string& prefix = "");

  // Parameters and buffers of the whole tree, by dotted name. Tensors are views of the module's
  // own bytes (no copy): clone them to keep a snapshot across training steps.
  StateDict state_dict(const std::string& prefix = "") const;

  // Loads parameters and buffers from `source` (see load_state_dict.hpp for the rules and the
  // report; include it to use the result).
  LoadReport load_state_dict(const StateDict& source, const LoadOptions& options = {});

 protected:
  // Plans this module's part of a load (its own entries only, not the children's): claims keys,
  // records problems and the writes to make. Must not modify the module. Overridden by modules
  // that accept more than one checkpoint layout (module_extension.hpp has LoadPlan).
  virtual void plan_load(const LoadSource& source, const std::string& prefix, LoadPlan& plan);

  // Registers a parameter or buffer; returns its index. An optional buffer may be absent from
  // a state dict without being missing (LoadReport::absent).
  size_t register_parameter(std::string name, Tensor value);
  size_t register_buffer(std::string name, Tensor value, bool optional = false);
  Parameter& parameter_at(size_t i) { return params_.at(i); }
  const Parameter& parameter_at(size_t i) const { return params_.at(i); }
  std::pair<std::string, Tensor>& buffer_at(size_t i) { return buffers_.at(i); }

  friend class LoadPlan;

 private:
  std::vector<Parameter> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<bool> optional_buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// The parameter's value, writable: a value that borrows someone else's bytes (a read-only view,
// after load_state_dict with assign=true, or a file mapping) is first replaced by a private copy,
// so a write never reaches the lender and always reaches what the module reads.
Tensor& writable_value(Parameter& p);

// A module that only holds children, to build model trees.
class Sequential : public Module {};

}  // namespace grouplin
