// What the binding's files share: how each part registers itself with the module, and the
// conversions between Python's arguments and GroupLin's option types.
#pragma once

#include <nanobind/nanobind.h>
// Every file converts these: strings, lists, optionals, tuples and dicts of them.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "grouplin/grouped_gemm.hpp"
#include "grouplin/layout_rules.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin::python {

// Each adds its functions and classes to the extension module.
void bind_errors(nb::module_& m);
void bind_files(nb::module_& m);
void bind_layer(nb::module_& m);
void bind_gemm(nb::module_& m);
void bind_block(nb::module_& m);

// Rule sets by name (builtin_rule_names) or from a JSON file; empty: detected.
std::vector<LayoutRules> rules_from_names(const std::vector<std::string>& names);

// A state dict over the arrays (no copy), named `names`, of dtypes `dtypes` (None: the array's
// own). Throws Error(InvalidArgument) when the three lists differ in length, and the errors of
// tensor_from_array naming the entry.
StateDict state_dict_from_arrays(const std::vector<std::string>& names,
                                 const std::vector<InArray>& arrays,
                                 const std::vector<std::optional<std::string>>& dtypes);

// The experts from lists of arrays: one stacked [N, out, in] weight or N per-expert [out, in]
// weights; scales ([N, r, c] or N [r, c]) and biases ([N, out] or N [out]) alike, or empty.
ExpertWeights experts_from_arrays(const std::vector<InArray>& weights,
                                  const std::optional<std::string>& weight_dtype,
                                  const std::vector<InArray>& scales,
                                  const std::vector<InArray>& biases,
                                  const std::optional<std::string>& bias_dtype);

// [(name, dtype name, array viewing the tensor)] in the dict's order.
nb::list arrays_from_state_dict(const StateDict& tensors, Framework framework);

}  // namespace grouplin::python
