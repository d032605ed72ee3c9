// Loading state dicts into module trees: the options and the report (Module::load_state_dict).
//
//   grouplin::LoadOptions o;
//   o.prefix = "model.layers.3.mlp.experts.";  // this module's entries in a whole-model dict
//   grouplin::LoadReport r;                     // as module.load_state_dict(sd, o) returns it
//   for (const auto& c : r.layout_conversions)
//     std::cout << c.module << ": " << layout_name(c.from) << " -> " << layout_name(c.to) << "\n";
//
// Rules: every GroupedLinear accepts per-expert (weight{i}, bias{i}) or single-layout (weight
// [N,out,in], bias [N,out]) entries whatever its own layout. Everything is checked before
// anything is written; on error the module tree is bit-identical to before and one Error lists
// every problem (Error::problems() lists each with its key; the code is their common code, or
// LoadFailed when they differ). The caller's dict is never modified. Float dtypes convert on load,
// except FP8 into another dtype: refused with Fp8ScalesNotApplied (the scales would not be
// applied).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/layout.hpp"
#include "grouplin/layout_rules.hpp"

namespace grouplin {

struct LoadOptions {
  // Missing and unexpected keys (and partial expert sets) are errors. With strict=false they
  // are reported and everything that matches is loaded.
  bool strict = true;
  // Adopt the source tensors' bytes instead of copying where the module's layout allows it
  // (same dtype; PerExpert or Single targets). The module then holds read-only views of them
  // (Tensor::read_only): a write through any of its views throws ReadOnlyTensor, and its own
  // first write (writable_value, an optimizer step) goes to a private copy.
  bool assign = false;
  // Where this module's entries sit in the source: "model.layers.3.mlp.experts." loads the
  // module from a whole-model dict without rewriting its keys. Keys outside the prefix are not
  // this load's business (never unexpected); report keys are the source's full keys. "" or a
  // prefix ending in '.'.
  std::string prefix{};
  // How grouped modules are named in the source (layout_rules.hpp); empty: detected from its
  // keys. Through Hugging Face rules a module list or transformers v5's fused experts load into
  // GroupedLinears named after the fused tensors: P.gate_up_proj (out = 2I) and P.down_proj.
  std::vector<LayoutRules> rules{};
  // config.json's model_type (Checkpoint::model_type of a directory), for detecting the rules of
  // fused experts whose keys do not tell the family ("mixtral": hf-mixtral).
  std::string model_type{};
  // Load experts [begin, end) of every grouped module of the source into modules of
  // end - begin experts (one rank of an expert-parallel job): only those experts' bytes are read.
  std::optional<ExpertRange> experts{};
};

struct LayoutConversion {
  std::string module;  // dotted prefix of the GroupedLinear, "" for the root
  ExpertLayout from;   // the checkpoint's layout
  WeightLayout to;     // the module's layout
};

struct DTypeConversion {
  std::string key;
  DType from;
  DType to;
};

struct LoadReport {
  // Source keys whose values were loaded (the experts of a module list gathered into one stacked
  // tensor: that tensor's name in transformers v5's fused form).
  std::vector<std::string> loaded;
  std::vector<std::string> missing;     // expected keys the source lacked
  std::vector<std::string> unexpected;  // source keys (under the prefix) no module claimed
  // Optional entries the source lacked, kept as they were: a GroupedLinear's _extra_state
  // (absent from Hugging Face and most non-TE checkpoints). Never an error, strict or not.
  std::vector<std::string> absent;
  std::vector<LayoutConversion> layout_conversions;
  std::vector<DTypeConversion> dtype_conversions;
};

}  // namespace grouplin
