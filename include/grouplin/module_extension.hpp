// For authors of modules: the plan a load builds before it writes anything, which each
// Module::plan_load fills in for its own entries. Users of modules never need this header (it is
// not part of grouplin.hpp); see load_state_dict.hpp for loading.
//
//   class Scale : public grouplin::Module {  // loads "gamma", or its old name "scale"
//    public:
//     Scale() { register_parameter("gamma", grouplin::Tensor::zeros({4}, grouplin::DType::F32)); }
//
//    protected:
//     void plan_load(const grouplin::LoadSource& source, const std::string& prefix,
//                    grouplin::LoadPlan& plan) override {
//       for (const char* name : {"gamma", "scale"}) {
//         const std::string key = prefix + name;
//         if (const grouplin::SourceTensor* t = source.find(key)) {
//           plan.claim(key);
//           plan.plan_copy(key, *t, *this, 0);  // checked now, written once all checks passed
//           return;
//         }
//       }
//       plan.add_missing(prefix + "gamma");
//     }
//   };
//   Scale scale;
//   grouplin::StateDict old;
//   old.insert("scale", grouplin::Tensor::zeros({4}, grouplin::DType::BF16));
//   scale.load_state_dict(old);  // BF16 "scale" into F32 "gamma"
#pragma once

#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module.hpp"
#include "grouplin/state_dict.hpp"

namespace grouplin {

struct PlannedTensor;  // private: how the load reads an entry's bytes
class PlannedDict;

// One entry a load reads, as the modules see it: the checkpoint's entry in the module's form
// (its layout, FP8 codes beside their scales, or values of FP8 codes dequantized). Its bytes are
// read only when the load executes, after every check has passed.
class SourceTensor {
 public:
  const std::string& name() const;
  DType dtype() const;
  const Shape& shape() const;
  // Copies its values into `dst` (same element count; float dtypes convert as
  // Tensor::copy_from does). Throws as Tensor::copy_from.
  void copy_to(Tensor& dst) const;

 private:
  friend class LoadSource;
  friend class LoadPlan;
  explicit SourceTensor(const PlannedTensor& t) : t_(&t) {}
  const PlannedTensor* t_;
};

// The entries a load reads, by name, in order. Lives for the duration of the load.
class LoadSource {
 public:
  const SourceTensor* find(const std::string& name) const;
  size_t size() const { return entries_.size(); }
  std::vector<SourceTensor>::const_iterator begin() const { return entries_.begin(); }
  std::vector<SourceTensor>::const_iterator end() const { return entries_.end(); }

 private:
  friend class Module;
  explicit LoadSource(const PlannedDict& dict);
  const PlannedDict* dict_;
  std::vector<SourceTensor> entries_;
};

// What a load will do, filled in by Module::plan_load before anything is written.
class LoadPlan {
 public:
  explicit LoadPlan(const LoadOptions& options) : options_(options) {}
  const LoadOptions& options() const { return options_; }

  // The key belongs to some module (so it is not unexpected), loaded or not.
  void claim(const std::string& key);
  bool claimed(const std::string& key) const;
  // An expected key the source lacks (not reported when a problem already accounts for it).
  void add_missing(const std::string& key);
  // A problem with `key` (the dotted key it concerns); every problem is reported together, each
  // once.
  void add_problem(ErrorCode code, const std::string& key, std::string message);
  // An optional entry (a buffer registered as optional) the source lacks: reported, no error.
  void add_absent(const std::string& key) { report_.absent.push_back(key); }
  void add_layout_conversion(LayoutConversion c) {
    report_.layout_conversions.push_back(std::move(c));
  }

  // Checks that `src` can fill `dst` (same shape, same or float-convertible dtype) and plans the
  // copy into parameter `param_index` of `module` (the slice `expert` of it when expert >= 0).
  // Records a problem and returns false otherwise.
  bool plan_copy(const std::string& key, const SourceTensor& src, Module& module,
                 size_t param_index, int64_t expert = -1);
  // Same for a buffer.
  bool plan_buffer_copy(const std::string& key, const SourceTensor& src, Module& module,
                        size_t buffer_index, int64_t expert = -1);
  // Plans making parameter `param_index` of `module` borrow `src` (read-only until the module
  // writes) when `src` is one whole tensor of the same dtype, else plans a copy. Records a problem
  // and returns false when the shapes differ or the dtypes do not convert.
  bool plan_adopt(const std::string& key, const SourceTensor& src, Module& module,
                  size_t param_index);

 private:
  // Throws one Error listing every problem (and, when strict, missing and unexpected keys);
  // otherwise performs the planned writes and returns the report (Module::load_state_dict).
  LoadReport execute(const LoadSource& source);

  struct Write {
    std::string key;
    const PlannedTensor* src;
    Module* module;
    size_t index;    // parameter or buffer index
    int64_t expert;  // slice of a stacked parameter, or -1 for the whole tensor
    bool buffer;
    bool adopt;
  };
  bool check_compatible(const std::string& key, const PlannedTensor& src, const Tensor& dst);
  // The source's name for the entry the modules see as `key` (an expert of a stacked entry is
  // reported as that entry).
  const std::string& source_key(const std::string& key) const;

  friend class Module;  // load_state_dict hands over what fitting the source found
  LoadOptions options_;
  LoadReport report_;
  std::vector<Write> writes_;
  std::vector<Problem> problems_;
  std::set<std::pair<ErrorCode, std::string>> reported_;  // (code, key) of add_problem's
  std::vector<std::string> claimed_;
  std::set<std::string> covered_;                         // keys a problem accounts for
  std::unordered_map<std::string, std::string> origins_;  // module key -> source key
};

}  // namespace grouplin
