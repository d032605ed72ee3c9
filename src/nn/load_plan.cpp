#include <algorithm>
#include <set>

#include "core/fp8.hpp"
#include "grouplin/error.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/module_extension.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin {

const std::string& SourceTensor::name() const { return t_->name; }
DType SourceTensor::dtype() const { return t_->dtype; }
const Shape& SourceTensor::shape() const { return t_->shape; }
void SourceTensor::copy_to(Tensor& dst) const { t_->copy_to(dst); }

LoadSource::LoadSource(const PlannedDict& dict) : dict_(&dict) {
  entries_.reserve(dict.size());
  for (const PlannedTensor& t : dict) entries_.push_back(SourceTensor(t));
}

const SourceTensor* LoadSource::find(const std::string& name) const {
  const PlannedTensor* t = dict_->find(name);
  return t == nullptr ? nullptr : &entries_[static_cast<size_t>(t - &*dict_->begin())];
}

void LoadPlan::claim(const std::string& key) { claimed_.push_back(key); }

bool LoadPlan::claimed(const std::string& key) const {
  return std::find(claimed_.begin(), claimed_.end(), key) != claimed_.end();
}

void LoadPlan::add_missing(const std::string& key) {
  if (covered_.count(key) == 0) report_.missing.push_back(key);
}

void LoadPlan::add_problem(ErrorCode code, const std::string& key, std::string message) {
  // The experts of one stacked entry fail alike (a dtype): one problem for the entry.
  if (!reported_.emplace(code, key).second) return;
  problems_.push_back({code, key, std::move(message)});
}

const std::string& LoadPlan::source_key(const std::string& key) const {
  auto it = origins_.find(key);
  return it == origins_.end() ? key : it->second;
}

bool LoadPlan::check_compatible(const std::string& module_key, const PlannedTensor& src,
                                const Tensor& dst) {
  const std::string& key = source_key(module_key);
  if (src.shape != dst.shape()) {
    add_problem(ErrorCode::ShapeMismatch, key,
                quote(key) + ": shape " + shape_to_string(src.shape) + ", expected " +
                    shape_to_string(dst.shape()));
    return false;
  }
  // FP8 codes mean nothing without their scales: widening the codes alone gives wrong weights
  // with no error, the worst kind of load. With their scales beside them (key + "_scale_inv")
  // they arrive here dequantized already (Module::load_state_dict).
  if (core::is_fp8(src.dtype) && src.dtype != dst.dtype()) {
    add_problem(ErrorCode::Fp8ScalesNotApplied, key,
                quote(key) + ": dtype " + std::string(dtype_name(src.dtype)) + " into a " +
                    std::string(dtype_name(dst.dtype())) + " parameter without " +
                    quote(key + "_scale_inv") +
                    " beside it: FP8 codes are not values until multiplied by their scales");
    return false;
  }
  if (src.dtype != dst.dtype() && !(is_float(src.dtype) && is_float(dst.dtype()))) {
    add_problem(ErrorCode::UnsupportedConversion, key,
                quote(key) + ": dtype " + std::string(dtype_name(src.dtype)) +
                    " cannot be converted to " + std::string(dtype_name(dst.dtype())));
    return false;
  }
  return true;
}

namespace {
Tensor target_of(const Module& m, size_t index, int64_t expert) {
  const Tensor& t = m.parameters()[index].value;
  return expert >= 0 ? t.select(expert) : t;
}
}  // namespace

bool LoadPlan::plan_copy(const std::string& key, const SourceTensor& source, Module& module,
                         size_t param_index, int64_t expert) {
  const PlannedTensor& src = *source.t_;
  if (!check_compatible(key, src, target_of(module, param_index, expert))) return false;
  writes_.push_back({source_key(key), &src, &module, param_index, expert, false, false});
  return true;
}

bool LoadPlan::plan_buffer_copy(const std::string& key, const SourceTensor& source, Module& module,
                                size_t buffer_index, int64_t expert) {
  const PlannedTensor& src = *source.t_;
  const Tensor& buffer = module.buffers()[buffer_index].second;
  if (!check_compatible(key, src, expert >= 0 ? buffer.select(expert) : buffer)) return false;
  writes_.push_back({source_key(key), &src, &module, buffer_index, expert, true, false});
  return true;
}

bool LoadPlan::plan_adopt(const std::string& key, const SourceTensor& source, Module& module,
                          size_t param_index) {
  const PlannedTensor& src = *source.t_;
  const Tensor& dst = module.parameters()[param_index].value;
  if (!check_compatible(key, src, dst)) return false;
  // Only one whole tensor of the right dtype, in its stored order, can be borrowed; pieces are
  // gathered, transposed or interleaved experts moved, by a copy.
  if (src.dtype != dst.dtype() || src.pieces.size() != 1 || src.rearrange || src.dequantize) {
    return plan_copy(key, source, module, param_index);
  }
  writes_.push_back({source_key(key), &src, &module, param_index, -1, false, true});
  return true;
}

LoadReport LoadPlan::execute(const LoadSource& source) {
  std::set<std::string> claimed(claimed_.begin(), claimed_.end());
  for (const SourceTensor& t : source) {
    const std::string& key = t.name();
    // Keys outside the prefix belong to the rest of the model, not to this load.
    if (!key.starts_with(options_.prefix)) continue;
    if (claimed.count(key) == 0) report_.unexpected.push_back(key);
  }
  std::vector<Problem> all = problems_;
  if (options_.strict) {
    for (const auto& k : report_.missing) {
      all.push_back({ErrorCode::MissingKey, k, "missing key " + quote(k)});
    }
    for (const auto& k : report_.unexpected) {
      all.push_back({ErrorCode::UnexpectedKey, k, "unexpected key " + quote(k)});
    }
  }
  if (!all.empty()) {
    // One error for everything, so a user fixes a checkpoint in one round. The code is the
    // problems' common code, or LoadFailed when they differ.
    ErrorCode code = all.front().code;
    std::string msg = "loading state dict: " + std::to_string(all.size()) + " problem" +
                      (all.size() > 1 ? "s" : "") + "; nothing was loaded";
    for (const Problem& p : all) {
      if (p.code != code) code = ErrorCode::LoadFailed;
      msg += "\n  " + std::string(error_code_name(p.code)) + ": " + p.message;
    }
    throw Error(code, msg, std::move(all));
  }

  std::set<std::string> loaded, converted;
  for (Write& w : writes_) {
    if (w.buffer) {
      Tensor& buffer = w.module->buffers_[w.index].second;
      Tensor dst = w.expert >= 0 ? buffer.select(w.expert) : buffer;
      w.src->copy_to(dst);
    } else {
      Parameter& p = w.module->params_[w.index];
      if (w.adopt) {
        // Borrowed: the module shows only read-only views of the caller's bytes, and its own
        // first write (writable_value) goes to a private copy.
        p.value = w.src->pieces[0].reshape(w.src->shape).read_only();
      } else {
        if (!p.value.writable() && w.expert < 0) {
          // The whole borrowed tensor is about to be overwritten: a fresh allocation is
          // enough, cloning the borrowed bytes first would copy every byte twice.
          p.value = Tensor::zeros(p.value.shape(), p.value.dtype());
        }
        Tensor& v = writable_value(p);
        Tensor dst = w.expert >= 0 ? v.select(w.expert) : v;
        w.src->copy_to(dst);
      }
      // A stacked key loaded into per-expert parameters is one conversion, reported once.
      const DType from = w.src->dequantize ? w.src->dequantize->codes : w.src->dtype;
      if (from != p.value.dtype() && !converted.count(w.key)) {
        converted.insert(w.key);
        report_.dtype_conversions.push_back({w.key, from, p.value.dtype()});
      }
    }
    if (loaded.insert(w.key).second) report_.loaded.push_back(w.key);
  }
  return report_;
}

}  // namespace grouplin
