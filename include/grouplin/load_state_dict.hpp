// Loading state dicts into module trees: options, the report, and the plan modules fill in.
//
//   grouplin::LoadReport r = model.load_state_dict(sd, {.strict = true, .assign = false});
//   for (const auto& c : r.layout_conversions)
//     std::cout << c.module << ": " << c.from << " -> " << c.to << "\n";
//
// Rules: every GroupedLinear accepts per-expert (weight{i}, bias{i}) or stacked (weight
// [N,out,in], bias [N,out]) entries whatever its own layout. Everything is checked before
// anything is written; on error the module tree is bit-identical to before and one Error lists
// every problem. The caller's dict is never modified. Float dtypes convert on load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/module.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin {

struct LoadOptions {
  // Missing and unexpected keys (and partial expert sets) are errors. With strict=false they
  // are reported and everything that matches is loaded.
  bool strict = true;
  // Adopt the source tensors' bytes instead of copying where the module's layout allows it
  // (same dtype; PerExpert or Single targets). Adopted parameters are copied on first write.
  bool assign = false;
};

struct LayoutConversion {
  std::string module;  // dotted prefix of the GroupedLinear, "" for the root
  std::string from;    // "per-expert" or "stacked": the checkpoint's layout
  std::string to;      // the module's layout: "per-expert", "contiguous" or "single"
};

struct DTypeConversion {
  std::string key;
  DType from;
  DType to;
};

struct LoadReport {
  std::vector<std::string> loaded;      // source keys whose values were loaded
  std::vector<std::string> missing;     // expected keys the source lacked
  std::vector<std::string> unexpected;  // source keys no module claimed
  std::vector<LayoutConversion> layout_conversions;
  std::vector<DTypeConversion> dtype_conversions;
};

// What a load will do, filled in by Module::plan_load before anything is written.
class LoadPlan {
 public:
  explicit LoadPlan(const LoadOptions& options) : options_(options) {}
  const LoadOptions& options() const { return options_; }

  // The key belongs to some module (so it is not unexpected), loaded or not.
  void claim(const std::string& key);
  bool claimed(const std::string& key) const;
  void add_missing(const std::string& key);
  void add_problem(ErrorCode code, std::string message);
  void add_layout_conversion(LayoutConversion c) {
    report_.layout_conversions.push_back(std::move(c));
  }

  // Checks that `src` can fill `dst` (same shape, same or float-convertible dtype) and plans the
  // copy into parameter `param_index` of `module` (the slice `expert` of it when expert >= 0).
  // Records a problem and returns false otherwise.
  bool plan_copy(const std::string& key, const Tensor& src, Module& module, size_t param_index,
                 int64_t expert = -1);
  // Same for a buffer.
  bool plan_buffer_copy(const std::string& key, const Tensor& src, Module& module,
                        size_t buffer_index);
  // Plans making parameter `param_index` of `module` borrow `src` (copy-on-write). Requires the
  // same shape and dtype; records a problem and returns false otherwise.
  bool plan_adopt(const std::string& key, const Tensor& src, Module& module, size_t param_index);

  // Throws one Error listing every problem (and, when strict, missing and unexpected keys);
  // otherwise performs the planned writes and returns the report.
  LoadReport execute(const StateDict& source);

 private:
  struct Write {
    std::string key;
    Tensor src;
    Module* module;
    size_t index;    // parameter or buffer index
    int64_t expert;  // slice of a stacked parameter, or -1 for the whole tensor
    bool buffer;
    bool adopt;
  };
  bool check_compatible(const std::string& key, const Tensor& src, const Tensor& dst);

  LoadOptions options_;
  LoadReport report_;
  std::vector<Write> writes_;
  std::vector<std::pair<ErrorCode, std::string>> problems_;
  std::vector<std::string> claimed_;
};

}  // namespace grouplin
