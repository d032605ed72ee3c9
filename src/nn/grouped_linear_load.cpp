// GroupedLinear's part of load_state_dict: accept per-expert or single-layout entries whatever
// the module's own layout, check them against the module (its expert count and shapes, which the
// layout rules that brought the entries into this form cannot know), and plan at most one copy
// of each byte. Which names are expert entries is the one rule of src/layout/expert_names.hpp,
// shared with the checkpoint scan of `grouplin inspect` and `convert`.
#include <map>
#include <optional>

#include "core/fp8.hpp"
#include "grouplin/error.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module_extension.hpp"
#include "layout/expert_names.hpp"

namespace grouplin {
namespace {

std::string join_indices(const std::vector<int64_t>& v, size_t limit = 16) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

// One parameter family ("weight" or "bias") of one GroupedLinear, and where its values go.
struct Family {
  GroupedLinear& module;
  LoadPlan& plan;
  std::string prefix;       // "decoder.layers.3.mlp.fc1." ("" at the root)
  std::string module_name;  // for messages: the prefix without its dot, or "<root>"
  std::string report_name;  // for the report: the prefix without its dot ("" at the root)
  std::string base;         // "weight" or "bias"
  Shape expert_shape;       // [out, in] or [out]
  size_t single_index = 0;  // Single layout: the parameter holding all experts
  size_t first_index = 0;   // PerExpert/Contiguous: the parameter of expert 0 (the same index)
  size_t first_scale = 0;   // FP8 weights: the scale buffer of expert 0 (Single: of all)
  // What the source holds for this family.
  const PlannedTensor* stacked = nullptr;           // prefix + base, any shape
  std::map<int64_t, const PlannedTensor*> experts;  // prefix + base{i}, by i

  int64_t n() const { return module.num_gemms(); }
  WeightLayout layout() const { return base == "bias" ? module.bias_layout() : module.layout(); }
  std::string stacked_key() const { return prefix + base; }
  std::string expert_key(int64_t i) const { return layout::expert_key(prefix, base, i); }
  // FP8 weights load as codes with their scales, never as values.
  bool fp8() const { return base == "weight" && module.options().params_dtype == DType::F8_E4M3; }
  // assign adopts a source tensor only where the module holds that tensor whole, as is.
  bool adopts(const PlannedTensor& src, WeightLayout holder) const {
    return plan.options().assign && layout() == holder &&
           src.dtype == module.options().params_dtype;
  }
};

// An FP8 weight entry parted into its codes and its scales.
struct Fp8Parts {
  PlannedTensor codes, scales;
  Fp8Parts select(int64_t i) const { return {codes.select(i), scales.select(i)}; }
};

// The loader hands an FP8 entry over with its scales attached, planned as values
// (Module::load_state_dict); an FP8 module takes it apart again, keeping every byte. Records a
// problem and returns nullopt for anything but E4M3 codes with 128 x 128 block scales.
std::optional<Fp8Parts> fp8_parts(Family& f, const std::string& key, const PlannedTensor& src) {
  const std::string what =
      "module " + quote(f.module_name) + " holds F8_E4M3 weights: " + quote(key) + " ";
  if (!src.dequantize) {
    const bool codes = src.dtype == DType::F8_E4M3 || src.dtype == DType::F8_E5M2;
    f.plan.add_problem(
        codes ? ErrorCode::Fp8ScalesNotApplied : ErrorCode::UnsupportedConversion, key,
        what + (codes ? "is " + std::string(dtype_name(src.dtype)) + " codes without " +
                            quote(key + "_scale_inv") + " beside it"
                      : "holds " + std::string(dtype_name(src.dtype)) +
                            " values, which GroupLin does not quantize (load them into an F32 "
                            "or BF16 module)"));
    return std::nullopt;
  }
  const Dequantization& d = *src.dequantize;
  const int64_t block = core::kFp8Block;
  if (d.codes != DType::F8_E4M3 || d.block_rows != block || d.block_cols != block) {
    f.plan.add_problem(ErrorCode::UnsupportedConversion, key,
                       what + "is " + std::string(dtype_name(d.codes)) + " with scales " +
                           quote(d.scales_name) + " per " + std::to_string(d.block_rows) + " x " +
                           std::to_string(d.block_cols) +
                           " block; expected F8_E4M3 with one scale per " + std::to_string(block) +
                           " x " + std::to_string(block) + " block");
    return std::nullopt;
  }
  Fp8Parts parts{src, {}};
  parts.codes.dequantize.reset();
  parts.codes.dtype = d.codes;
  Shape scale_shape(src.shape.begin(), src.shape.end() - 2);
  scale_shape.push_back(d.scale_rows());
  scale_shape.push_back(d.scale_cols());
  parts.scales = PlannedTensor{d.scales_name, d.scale_dtype, scale_shape, d.scales};
  return parts;
}

// Codes into weight parameter `param` (its slice `expert`, when >= 0) and scales into its scale
// buffer (the Single layout's stacked one, or that of the parameter's expert).
bool plan_fp8(Family& f, const std::string& key, const Fp8Parts& parts, size_t param,
              int64_t expert) {
  const bool single = f.layout() == WeightLayout::Single;
  const size_t buffer = f.first_scale + (single ? 0 : param - f.first_index);
  return f.plan.plan_copy(key, parts.codes, f.module, param, expert) &&
         f.plan.plan_buffer_copy(parts.scales.name, parts.scales, f.module, buffer, expert);
}

// Both layouts at once: nothing is planned, every entry is claimed (not also unexpected).
void plan_both_layouts(Family& f) {
  f.plan.add_problem(ErrorCode::BothLayoutsPresent, f.stacked_key(),
                     "module " + quote(f.module_name) + ": both " + quote(f.stacked_key()) +
                         " and " + std::to_string(f.experts.size()) + " per-expert " +
                         quote(f.prefix + f.base + "{i}") +
                         " entries are present; expected one "
                         "layout");
  f.plan.claim(f.stacked_key());
  for (const auto& [i, t] : f.experts) f.plan.claim(f.expert_key(i));
}

// A single-layout source: one [N, ...] entry.
void plan_from_single(Family& f) {
  const std::string key = f.stacked_key();
  f.plan.claim(key);
  Shape want = f.expert_shape;
  want.insert(want.begin(), f.n());
  // A stacked bias saved as [N, 1, out] (as TransformerEngine may) holds the bytes of [N, out],
  // as the checkpoint scan reads it too.
  PlannedTensor squeezed = *f.stacked;
  if (f.base == "bias" && squeezed.rank() == 3 && squeezed.dim(1) == 1) {
    squeezed.shape = {squeezed.dim(0), squeezed.dim(2)};
  }
  const PlannedTensor& src = squeezed;
  if (src.rank() == want.size() && src.dim(0) != f.n()) {
    f.plan.add_problem(ErrorCode::ExpertCountMismatch, key,
                       quote(key) + ": " + std::to_string(src.dim(0)) + " experts " +
                           shape_to_string(src.shape) + ", module has " + std::to_string(f.n()) +
                           " " + shape_to_string(want));
    return;
  }
  std::optional<Fp8Parts> fp8;
  if (f.fp8() && !(fp8 = fp8_parts(f, key, src))) return;
  if (fp8 && f.layout() == WeightLayout::Single) {
    plan_fp8(f, key, *fp8, f.single_index, -1);
    return;
  }
  if (f.layout() == WeightLayout::Single) {
    if (f.adopts(src, WeightLayout::Single)) {
      f.plan.plan_adopt(key, src, f.module, f.single_index);
    } else {
      f.plan.plan_copy(key, src, f.module, f.single_index);
    }
    return;
  }
  if (src.shape != want) {  // reported once, not once per expert
    f.plan.add_problem(ErrorCode::ShapeMismatch, key,
                       quote(key) + ": shape " + shape_to_string(src.shape) + ", expected " +
                           shape_to_string(want));
    return;
  }
  // Each expert reads through a view of the source: no split copies.
  const bool adopt = f.adopts(src, WeightLayout::PerExpert);
  for (int64_t i = 0; i < f.n(); ++i) {
    const size_t idx = f.first_index + static_cast<size_t>(i);
    const bool ok = fp8     ? plan_fp8(f, key, fp8->select(i), idx, -1)
                    : adopt ? f.plan.plan_adopt(key, src.select(i), f.module, idx)
                            : f.plan.plan_copy(key, src.select(i), f.module, idx);
    if (!ok) return;  // every expert would fail alike (dtype): report the key once
  }
  if (f.base == "weight") {
    f.plan.add_layout_conversion({f.report_name, ExpertLayout::Single, f.layout()});
  }
}

// A per-expert source: entries base0 .. base{N-1}.
void plan_from_per_expert(Family& f) {
  std::vector<int64_t> extra, absent;
  for (const auto& [i, t] : f.experts) {
    if (i >= f.n()) extra.push_back(i);
  }
  for (int64_t i = 0; i < f.n(); ++i) {
    if (f.experts.count(i) == 0) absent.push_back(i);
  }
  if (!extra.empty()) {
    f.plan.add_problem(ErrorCode::ExpertCountMismatch, f.expert_key(extra.back()),
                       "module " + quote(f.module_name) + ": checkpoint has " +
                           quote(f.expert_key(extra.back())) + " but the module has " +
                           std::to_string(f.n()) + " experts (" + f.base + "0.." + f.base +
                           std::to_string(f.n() - 1) + ")");
    for (int64_t i : extra) f.plan.claim(f.expert_key(i));
  }
  if (!absent.empty()) {
    // Strict: PartialExpertSet problems, one per absent expert with its exact key, the first
    // naming them all (not MissingKey, which would turn the code into LoadFailed). Otherwise
    // they are reported missing.
    if (f.plan.options().strict) {
      f.plan.add_problem(ErrorCode::PartialExpertSet, f.expert_key(absent.front()),
                         "module " + quote(f.module_name) + ": " +
                             std::to_string(f.experts.size() - extra.size()) + " of " +
                             std::to_string(f.n()) + " " + quote(f.prefix + f.base + "{i}") +
                             " entries present; missing experts " + join_indices(absent));
      for (size_t k = 1; k < absent.size(); ++k) {
        f.plan.add_problem(
            ErrorCode::PartialExpertSet, f.expert_key(absent[k]),
            "module " + quote(f.module_name) + ": missing " + quote(f.expert_key(absent[k])));
      }
    } else {
      for (int64_t i : absent) f.plan.add_missing(f.expert_key(i));
    }
  }
  const bool single = f.layout() == WeightLayout::Single;
  for (const auto& [i, t] : f.experts) {
    if (i >= f.n()) continue;
    const std::string key = f.expert_key(i);
    f.plan.claim(key);
    if (f.fp8()) {
      if (const std::optional<Fp8Parts> parts = fp8_parts(f, key, *t)) {
        plan_fp8(f, key, *parts, single ? f.single_index : f.first_index + static_cast<size_t>(i),
                 single ? i : -1);
      }
    } else if (single) {
      // Straight into the module's single storage: one copy, no stacked temporary.
      f.plan.plan_copy(key, *t, f.module, f.single_index, i);
    } else if (f.adopts(*t, WeightLayout::PerExpert)) {
      f.plan.plan_adopt(key, *t, f.module, f.first_index + static_cast<size_t>(i));
    } else {
      f.plan.plan_copy(key, *t, f.module, f.first_index + static_cast<size_t>(i));
    }
  }
  if (single && f.base == "weight") {
    f.plan.add_layout_conversion({f.report_name, ExpertLayout::PerExpert, WeightLayout::Single});
  }
}

void plan_family(Family& f) {
  if (f.stacked != nullptr && !f.experts.empty()) return plan_both_layouts(f);
  if (f.stacked != nullptr) return plan_from_single(f);
  if (!f.experts.empty()) return plan_from_per_expert(f);
  if (f.layout() == WeightLayout::Single) {
    f.plan.add_missing(f.stacked_key());
  } else {
    for (int64_t i = 0; i < f.n(); ++i) f.plan.add_missing(f.expert_key(i));
  }
}

}  // namespace

void GroupedLinear::plan_load(const PlannedDict& source, const std::string& prefix,
                              LoadPlan& plan) {
  // The report names the root "" (load_state_dict.hpp); messages say "<root>".
  const std::string report_name = prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1);
  auto family = [&](const char* base, Shape expert_shape, size_t index) {
    Family f{*this,
             plan,
             prefix,
             prefix.empty() ? "<root>" : report_name,
             report_name,
             base,
             std::move(expert_shape),
             index,
             index,
             scale_buffer(0),
             source.find(prefix + base),
             {}};
    return f;
  };
  std::vector<Family> families;
  families.push_back(family("weight", {options_.out_features, options_.in_features}, 0));
  if (options_.bias) {
    families.push_back(family("bias", {options_.out_features}, first_bias_param()));
  }

  // Which per-expert entries does the source hold for this module? One pass over the keys.
  for (const PlannedTensor& t : source) {
    const std::string& key = t.name;
    if (key.size() <= prefix.size() || key.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string_view leaf = std::string_view(key).substr(prefix.size());
    for (Family& f : families) {
      if (auto i = layout::expert_index(leaf, f.base)) f.experts[*i] = &t;
    }
  }
  for (Family& f : families) plan_family(f);

  // _extra_state loads like any module's buffer, and may be absent.
  const std::string extra_key = prefix + buffers()[0].first;
  if (const PlannedTensor* src = source.find(extra_key)) {
    plan.claim(extra_key);
    plan.plan_buffer_copy(extra_key, *src, *this, 0);
  } else {
    plan.add_absent(extra_key);
  }
}

}  // namespace grouplin
