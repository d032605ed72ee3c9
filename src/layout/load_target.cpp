// The Load plan fitted to the modules it fills (layout/load_target.hpp).
#include "layout/load_target.hpp"

#include <map>
#include <optional>

#include "core/fp8.hpp"
#include "layout/dequantize_plan.hpp"
#include "layout/expert_names.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::layout {
namespace {

std::string join_indices(const std::vector<int64_t>& v, size_t limit = 16) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

// One parameter family ("weight" or "bias") of one target.
struct Family {
  const LoadTarget& target;
  std::string base;
  WeightLayout layout;
  Shape expert_shape;  // [out, in] or [out]
  bool fp8;            // codes with scales

  int64_t n() const { return target.num_experts; }
  std::string key() const { return target.prefix + base; }
  std::string expert_key(int64_t i) const { return layout::expert_key(target.prefix, base, i); }
  // For messages: the prefix without its dot, or "<root>"; for reports "" at the root.
  std::string report_name() const {
    return target.prefix.empty() ? "" : target.prefix.substr(0, target.prefix.size() - 1);
  }
  std::string module_name() const { return target.prefix.empty() ? "<root>" : report_name(); }
};

class Fitter {
 public:
  Fitter(std::vector<PlannedTensor>& tensors, bool strict, LoadFindings& out)
      : tensors_(tensors),
        strict_(strict),
        out_(out),
        drop_(tensors.size(), false),
        index_(tensors) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const SplitKey k = split_key(tensors_[i].name);
      for (const char* base : {"weight", "bias"}) {
        if (auto e = expert_index(k.leaf, base)) experts_[std::string(k.prefix) + base][*e] = i;
      }
    }
  }

  void fit(const Family& f) {
    const std::optional<size_t> stacked = index_.find(f.key());
    const auto experts = experts_.find(f.key());
    const bool has_experts = experts != experts_.end();
    if (stacked && has_experts) return both_layouts(f, *stacked, experts->second);
    if (stacked) return from_stacked(f, *stacked);
    if (has_experts) return from_per_expert(f, experts->second);
    // Nothing at all: the module reports its keys missing.
  }

  // Removes the dropped tensors and appends the new ones.
  void finish() {
    std::vector<PlannedTensor> kept;
    kept.reserve(tensors_.size() + added_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (!drop_[i]) kept.push_back(std::move(tensors_[i]));
    }
    for (PlannedTensor& t : added_) kept.push_back(std::move(t));
    tensors_ = std::move(kept);
  }

 private:
  void problem(ErrorCode code, const std::string& key, std::string message) {
    out_.problems.push_back({code, key, std::move(message)});
  }
  void cover(const Family& f) {
    if (f.layout == WeightLayout::Single) {
      out_.covered.push_back(f.key());
    } else {
      for (int64_t i = 0; i < f.n(); ++i) out_.covered.push_back(f.expert_key(i));
    }
  }
  void emit(PlannedTensor t, std::string name, const std::string& origin) {
    if (name != origin) out_.origins.emplace(name, origin);
    t.name = std::move(name);
    t.scale_of.clear();
    added_.push_back(std::move(t));
  }

  // Drops `codes` and its scales.
  void drop_with_scales(size_t codes) {
    drop_[codes] = true;
    if (auto s = index_.scales_of(tensors_[codes].name)) drop_[*s] = true;
  }

  // Codes and their scales as an FP8 module holds them (E4M3, one scale per kFp8Block square
  // block), or a problem recorded and nullopt.
  std::optional<size_t> fp8_scales(const Family& f, const std::string& key,
                                   const PlannedTensor& codes) {
    const std::string what =
        "module " + quote(f.module_name()) + " holds F8_E4M3 weights: " + quote(key) + " ";
    const std::optional<size_t> s =
        core::is_fp8(codes.dtype) ? index_.scales_of(codes.name) : std::nullopt;
    if (!s) {
      const bool fp8 = core::is_fp8(codes.dtype);
      problem(fp8 ? ErrorCode::Fp8ScalesNotApplied : ErrorCode::UnsupportedConversion, key,
              what + (fp8 ? "is " + std::string(dtype_name(codes.dtype)) + " codes without " +
                                quote(core::fp8_scale_name(key)) + " beside it"
                          : "holds " + std::string(dtype_name(codes.dtype)) +
                                " values, which GroupLin does not quantize (load them into an "
                                "F32 or BF16 module)"));
      return std::nullopt;
    }
    const PlannedTensor& scales = tensors_[*s];
    Dequantization d;
    try {
      d = fit_blocks(codes, scales);
    } catch (const Error& e) {
      problem(e.code(), key, e.message());
      return std::nullopt;
    }
    const int64_t block = core::kFp8Block;
    if (d.codes != DType::F8_E4M3 || d.block_rows != block || d.block_cols != block ||
        codes.rearrange || scales.rearrange) {
      problem(ErrorCode::UnsupportedConversion, key,
              what + "is " + std::string(dtype_name(d.codes)) + " with scales " +
                  quote(scales.name) + " per " + std::to_string(d.block_rows) + " x " +
                  std::to_string(d.block_cols) + " block" +
                  (codes.rearrange ? ", stored transposed or interleaved" : "") +
                  "; expected F8_E4M3 with one scale per " + std::to_string(block) + " x " +
                  std::to_string(block) + " block");
      return std::nullopt;
    }
    return s;
  }

  void both_layouts(const Family& f, size_t stacked, const std::map<int64_t, size_t>& experts) {
    problem(ErrorCode::BothLayoutsPresent, f.key(),
            "module " + quote(f.module_name()) + ": both " + quote(f.key()) + " and " +
                std::to_string(experts.size()) + " per-expert " +
                quote(f.target.prefix + f.base + "{i}") +
                " entries are present; expected one layout");
    drop_with_scales(stacked);
    for (const auto& [i, t] : experts) drop_with_scales(t);
    cover(f);
  }

  void from_stacked(const Family& f, size_t at) {
    PlannedTensor& src = tensors_[at];
    const std::string key = f.key();
    // A stacked bias saved as [N, 1, out] (as TransformerEngine may) holds the bytes of [N, out],
    // as the checkpoint scan reads it too.
    if (f.base == "bias" && src.rank() == 3 && src.dim(1) == 1) {
      src.shape = {src.dim(0), src.dim(2)};
    }
    Shape want = f.expert_shape;
    want.insert(want.begin(), f.n());
    if (src.rank() == want.size() && src.dim(0) != f.n()) {
      problem(ErrorCode::ExpertCountMismatch, key,
              quote(key) + ": " + std::to_string(src.dim(0)) + " experts " +
                  shape_to_string(src.shape) + ", module has " + std::to_string(f.n()) + " " +
                  shape_to_string(want));
      drop_with_scales(at);
      cover(f);
      return;
    }
    std::optional<size_t> scales;
    if (f.fp8 && !(scales = fp8_scales(f, key, src))) {
      drop_with_scales(at);
      cover(f);
      return;
    }
    if (f.layout == WeightLayout::Single) {  // the module's own form: shapes checked as it copies
      if (scales) {
        drop_[*scales] = true;
        emit(tensors_[*scales], core::fp8_scale_name(key), tensors_[*scales].name);
      }
      return;
    }
    if (src.shape != want) {  // reported once, not once per expert
      problem(ErrorCode::ShapeMismatch, key,
              quote(key) + ": shape " + shape_to_string(src.shape) + ", expected " +
                  shape_to_string(want));
      drop_with_scales(at);
      cover(f);
      return;
    }
    // Each expert reads through a view of the source: no split copies.
    drop_[at] = true;
    for (int64_t i = 0; i < f.n(); ++i) emit(src.select(i), f.expert_key(i), key);
    if (scales) {
      drop_[*scales] = true;
      const PlannedTensor& s = tensors_[*scales];
      for (int64_t i = 0; i < f.n(); ++i) {
        emit(s.select(i), core::fp8_scale_name(f.expert_key(i)), s.name);
      }
    }
    if (f.base == "weight") {
      out_.conversions.push_back({f.report_name(), ExpertLayout::Single, f.layout});
    }
  }

  void from_per_expert(const Family& f, const std::map<int64_t, size_t>& experts) {
    std::vector<int64_t> extra, absent;
    for (const auto& [i, t] : experts) {
      if (i >= f.n()) extra.push_back(i);
    }
    for (int64_t i = 0; i < f.n(); ++i) {
      if (experts.count(i) == 0) absent.push_back(i);
    }
    if (!extra.empty()) {
      problem(ErrorCode::ExpertCountMismatch, f.expert_key(extra.back()),
              "module " + quote(f.module_name()) + ": checkpoint has " +
                  quote(f.expert_key(extra.back())) + " but the module has " +
                  std::to_string(f.n()) + " experts (" + f.base + "0.." + f.base +
                  std::to_string(f.n() - 1) + ")");
      for (int64_t i : extra) drop_with_scales(experts.at(i));
    }
    if (!absent.empty() && strict_) {
      // One PartialExpertSet problem per absent expert with its exact key, the first naming
      // them all (not MissingKey, which would turn the code into LoadFailed). A non-strict load
      // loads the experts present and the module reports the others missing.
      problem(ErrorCode::PartialExpertSet, f.expert_key(absent.front()),
              "module " + quote(f.module_name()) + ": " +
                  std::to_string(experts.size() - extra.size()) + " of " + std::to_string(f.n()) +
                  " " + quote(f.target.prefix + f.base + "{i}") +
                  " entries present; missing experts " + join_indices(absent));
      for (size_t k = 1; k < absent.size(); ++k) {
        problem(ErrorCode::PartialExpertSet, f.expert_key(absent[k]),
                "module " + quote(f.module_name()) + ": missing " + quote(f.expert_key(absent[k])));
      }
      for (int64_t i : absent) out_.covered.push_back(f.expert_key(i));
    }
    for (const auto& [i, t] : experts) {
      if (i >= f.n() || !f.fp8) continue;
      const std::string key = f.expert_key(i);
      if (const std::optional<size_t> s = fp8_scales(f, key, tensors_[t])) {
        drop_[*s] = true;
        emit(tensors_[*s], core::fp8_scale_name(key), tensors_[*s].name);
      } else {
        drop_with_scales(t);
        out_.covered.push_back(key);
      }
    }
    if (f.base == "weight" && f.layout == WeightLayout::Single) {
      out_.conversions.push_back({f.report_name(), ExpertLayout::PerExpert, WeightLayout::Single});
    }
  }

  std::vector<PlannedTensor>& tensors_;
  bool strict_;
  LoadFindings& out_;
  std::vector<bool> drop_;
  std::vector<PlannedTensor> added_;
  const ScaleIndex index_;  // the given tensors by name, and their scales
  // Per-expert entries by stacked name (prefix + base) and index.
  std::unordered_map<std::string, std::map<int64_t, size_t>> experts_;
};

}  // namespace

LoadFindings fit_load_targets(std::vector<PlannedTensor>& tensors,
                              const std::vector<LoadTarget>& targets, bool strict) {
  LoadFindings out;
  Fitter fitter(tensors, strict, out);
  for (const LoadTarget& t : targets) {
    fitter.fit({t, "weight", t.weight_layout, {t.out_features, t.in_features}, t.fp8});
    if (t.bias) fitter.fit({t, "bias", t.bias_layout, {t.out_features}, false});
  }
  fitter.finish();
  return out;
}

}  // namespace grouplin::layout
