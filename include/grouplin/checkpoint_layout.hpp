// Grouped modules inside a checkpoint, found by their names and shapes, and the plan that
// rewrites them in another layout without copying anything.
//
//   grouplin::StateDict sd;  // e.g. grouplin::load_checkpoint("model.safetensors").tensors
//   sd.insert("mlp.experts.weight", grouplin::Tensor::zeros({8, 16, 32}, grouplin::DType::BF16));
//   for (const grouplin::GroupedModule& m : grouplin::find_grouped_modules(sd))
//     std::cout << m.prefix << " " << grouplin::layout_name(m.layout) << "\n";  // single
//   grouplin::ConversionPlan plan =
//       grouplin::plan_conversion(sd, grouplin::ExpertLayout::PerExpert);
//   for (const grouplin::PlannedTensor& t : plan.tensors)  // each piece is a view of sd
//     std::cout << t.name << ": " << t.pieces.size() << " pieces, " << t.nbytes() << " bytes\n";
//
// A grouped module with prefix P (empty, or ending in '.') is, as SPEC §5 names them:
//   per-expert  P.weight0 .. P.weight{N-1}, each [out, in], and optionally P.bias0 ..
//               P.bias{N-1}, each [out] (indices in decimal, no leading zeros, at most 9
//               digits, N >= 1: the same rule GroupedLinear's load applies);
//   single      P.weight [N, out, in] and optionally P.bias [N, out].
// A rank-3 P.weight whose P.bias has rank 1 is a convolution, not a grouped module; a rank-2
// P.weight is a plain linear layer. Everything else is an ordinary entry and passes through.
// The scan checks every candidate; the problems, each naming the prefix:
//   missing indices, or biases for some experts only, or biases without weights .. PartialExpertSet
//   P.weight or P.bias beside P.weight{i} / P.bias{i} ......................... BothLayoutsPresent
//   a weight not [out, in] (or not [N, out, in]), weights of different shapes,
//   a bias not [out] (or not [N, out]) ............................................. ShapeMismatch
//   weights of different dtypes, or biases of different dtypes .................... DTypeMismatch
//
// The functions share no state; they may run on several threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin {

// One grouped module found in a state dict.
struct GroupedModule {
  std::string prefix;  // "model.layers.3.mlp.experts." ("" at the root)
  ExpertLayout layout = ExpertLayout::PerExpert;
  int64_t num_experts = 0;
  int64_t out_features = 0;
  int64_t in_features = 0;
  DType dtype = DType::F32;  // of the weights
  bool bias = false;
  DType bias_dtype = DType::F32;  // of the biases, when bias
  std::vector<std::string> keys;  // the module's entries in the dict, in dict order
};

// What a scan found: the consistent grouped modules, in the order of their first entry in the
// dict, and one Error per inconsistent candidate (codes listed above).
struct GroupedScan {
  std::vector<GroupedModule> modules;
  std::vector<Error> problems;
};

// Finds the grouped modules of `dict` by name and shape. Never throws for what the dict holds;
// problems are returned. Reads no tensor data.
GroupedScan scan_grouped_modules(const StateDict& dict);

// scan_grouped_modules, throwing the first problem (in dict order) if there is any.
std::vector<GroupedModule> find_grouped_modules(const StateDict& dict);

// One tensor of a converted checkpoint: its bytes are the bytes of `pieces`, in order. Every piece
// is a view of the source dict (a whole entry, or one expert of a single-layout entry).
struct PlannedTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<Tensor> pieces;

  // Bytes of the tensor (the sum of the pieces' bytes).
  uint64_t nbytes() const;
};

// The entries of `dict` with every grouped module in `target` layout.
struct ConversionPlan {
  std::vector<GroupedModule> modules;  // as found in the source (their source layout)
  std::vector<PlannedTensor> tensors;  // in output order
};

// Plans the conversion of every grouped module of `dict` to `target`: per-expert -> single gives
// P.weight [N, out, in] whose pieces are the N weights (and P.bias [N, out] from the N biases);
// single -> per-expert gives P.weight{i} = expert i of P.weight (and P.bias{i}); modules already
// in `target` layout and every other entry pass through as one piece. The output keeps the
// dict's order, a module's entries taking the place of its first entry; per-expert entries are
// weight0..weight{N-1} then bias0..bias{N-1}, as GroupedLinear::state_dict() orders them.
// Copies no tensor bytes; the pieces keep the source storages alive.
// Throws the first problem of scan_grouped_modules.
ConversionPlan plan_conversion(const StateDict& dict, ExpertLayout target);

}  // namespace grouplin
