// Recognising grouped modules by name and shape, and planning their conversion as lists of views.
#include "grouplin/checkpoint_layout.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "layout/expert_names.hpp"

namespace grouplin {
namespace {

// Missing indices quoted in one PartialExpertSet message.
constexpr size_t kMaxListed = 8;

// The entries of one prefix that may form a grouped module.
struct Candidate {
  std::string prefix;
  std::map<int64_t, const StateDict::Entry*> weights;  // per-expert, by index
  std::map<int64_t, const StateDict::Entry*> biases;
  const StateDict::Entry* weight = nullptr;  // P.weight, any rank
  const StateDict::Entry* bias = nullptr;    // P.bias, any rank
};

// Splits "a.b.weight12" into ("a.b.", weight, 12) by the one expert-name rule; index -1 for a
// bare "weight" or "bias". Returns false for every other leaf.
bool split_name(const std::string& name, std::string& prefix, bool& is_weight, int64_t& index) {
  const layout::SplitKey k = layout::split_key(name);
  is_weight = k.leaf.starts_with("weight");
  if (!is_weight && !k.leaf.starts_with("bias")) return false;
  const std::string_view base = is_weight ? "weight" : "bias";
  if (k.leaf == base) {
    index = -1;
  } else if (std::optional<int64_t> i = layout::expert_index(k.leaf, base)) {
    index = *i;
  } else {
    return false;
  }
  prefix = std::string(k.prefix);
  return true;
}

std::string module_name(const std::string& prefix) {
  return prefix.empty() ? std::string("grouped module at the root")
                        : "grouped module " + quote(prefix);
}

// "weight3, weight7" for the indices in [0, n) that `present` lacks (at most kMaxListed).
std::string missing_list(const std::map<int64_t, const StateDict::Entry*>& present, int64_t n,
                         const char* leaf) {
  std::string out;
  size_t listed = 0;
  for (int64_t i = 0; i < n && listed < kMaxListed; ++i) {
    if (present.count(i)) continue;
    out += (listed ? ", " : "") + std::string(leaf) + std::to_string(i);
    ++listed;
  }
  const uint64_t missing = static_cast<uint64_t>(n) - present.size();  // present is within [0, n)
  if (missing > listed) out += " and " + std::to_string(missing - listed) + " more";
  return out;
}

// Checks a per-expert candidate; adds a module or a problem.
void check_per_expert(const Candidate& c, GroupedScan& scan) {
  const std::string what = module_name(c.prefix);
  auto fail = [&](ErrorCode code, const std::string& message) {
    scan.problems.emplace_back(code, what + ": " + message);
  };
  if (c.weight != nullptr || c.bias != nullptr) {
    const StateDict::Entry* both = c.weight != nullptr ? c.weight : c.bias;
    const StateDict::Entry* other =
        !c.weights.empty() ? c.weights.begin()->second : c.biases.begin()->second;
    fail(ErrorCode::BothLayoutsPresent, "has both " + quote(both->first) + " and " +
                                            quote(other->first) +
                                            " (single and per-expert layouts at once)");
    return;
  }
  if (c.weights.empty()) {
    fail(ErrorCode::PartialExpertSet, "has " + quote(c.biases.begin()->second->first) + " but no " +
                                          quote(c.prefix + "weight0") +
                                          " (biases without weights)");
    return;
  }
  const int64_t n = c.weights.rbegin()->first + 1;
  if (static_cast<int64_t>(c.weights.size()) != n) {
    fail(ErrorCode::PartialExpertSet, "has " + std::to_string(c.weights.size()) +
                                          " expert weights up to " +
                                          quote(c.weights.rbegin()->second->first) + " but lacks " +
                                          missing_list(c.weights, n, "weight"));
    return;
  }
  if (!c.biases.empty()) {
    const int64_t last_bias = c.biases.rbegin()->first;
    if (last_bias >= n) {
      fail(ErrorCode::PartialExpertSet, "has " + quote(c.biases.rbegin()->second->first) +
                                            " but only " + std::to_string(n) + " expert weights");
      return;
    }
    if (static_cast<int64_t>(c.biases.size()) != n) {
      fail(ErrorCode::PartialExpertSet, "has biases for " + std::to_string(c.biases.size()) +
                                            " of its " + std::to_string(n) + " experts; lacks " +
                                            missing_list(c.biases, n, "bias"));
      return;
    }
  }
  const Tensor& w0 = c.weights.begin()->second->second;
  if (w0.rank() != 2) {
    fail(ErrorCode::ShapeMismatch, quote(c.weights.begin()->second->first) + " has shape " +
                                       shape_to_string(w0.shape()) +
                                       ", expected [out_features, in_features]");
    return;
  }
  for (const auto& [i, e] : c.weights) {
    if (e->second.shape() != w0.shape()) {
      fail(ErrorCode::ShapeMismatch,
           quote(e->first) + " has shape " + shape_to_string(e->second.shape()) + ", expected " +
               shape_to_string(w0.shape()) + " as " + quote(c.weights.begin()->second->first));
      return;
    }
    if (e->second.dtype() != w0.dtype()) {
      fail(ErrorCode::DTypeMismatch, quote(e->first) + " is " +
                                         std::string(dtype_name(e->second.dtype())) +
                                         ", expected " + std::string(dtype_name(w0.dtype())) +
                                         " as " + quote(c.weights.begin()->second->first));
      return;
    }
  }
  GroupedModule m;
  m.prefix = c.prefix;
  m.layout = ExpertLayout::PerExpert;
  m.num_experts = n;
  m.out_features = w0.dim(0);
  m.in_features = w0.dim(1);
  m.dtype = w0.dtype();
  if (!c.biases.empty()) {
    const Tensor& b0 = c.biases.begin()->second->second;
    for (const auto& [i, e] : c.biases) {
      if (e->second.shape() != Shape{m.out_features}) {
        fail(ErrorCode::ShapeMismatch, quote(e->first) + " has shape " +
                                           shape_to_string(e->second.shape()) + ", expected [" +
                                           std::to_string(m.out_features) + "]");
        return;
      }
      if (e->second.dtype() != b0.dtype()) {
        fail(ErrorCode::DTypeMismatch, quote(e->first) + " is " +
                                           std::string(dtype_name(e->second.dtype())) +
                                           ", expected " + std::string(dtype_name(b0.dtype())) +
                                           " as " + quote(c.biases.begin()->second->first));
        return;
      }
    }
    m.bias = true;
    m.bias_dtype = b0.dtype();
  }
  scan.modules.push_back(std::move(m));
}

// Checks a single-layout candidate (P.weight of rank 3); adds a module or a problem, or nothing
// for a convolution.
void check_single(const Candidate& c, GroupedScan& scan) {
  const Tensor& w = c.weight->second;
  GroupedModule m;
  m.prefix = c.prefix;
  m.layout = ExpertLayout::Single;
  m.num_experts = w.dim(0);
  m.out_features = w.dim(1);
  m.in_features = w.dim(2);
  m.dtype = w.dtype();
  if (c.bias != nullptr) {
    const Tensor& b = c.bias->second;
    if (b.rank() == 1) return;  // weight [out, in, k] with bias [out]: a convolution
    if (b.shape() != Shape{m.num_experts, m.out_features}) {
      scan.problems.emplace_back(
          ErrorCode::ShapeMismatch,
          module_name(c.prefix) + ": " + quote(c.bias->first) + " has shape " +
              shape_to_string(b.shape()) + ", expected [num_experts, out_features] = [" +
              std::to_string(m.num_experts) + ", " + std::to_string(m.out_features) + "] for " +
              quote(c.weight->first) + " of shape " + shape_to_string(w.shape()));
      return;
    }
    m.bias = true;
    m.bias_dtype = b.dtype();
  }
  if (m.num_experts == 0) {
    scan.problems.emplace_back(ErrorCode::ShapeMismatch,
                               module_name(c.prefix) + ": " + quote(c.weight->first) +
                                   " has shape " + shape_to_string(w.shape()) +
                                   ": no experts (a grouped module has at least one)");
    return;
  }
  scan.modules.push_back(std::move(m));
}

}  // namespace

GroupedScan scan_grouped_modules(const StateDict& dict) {
  std::vector<Candidate> candidates;
  std::unordered_map<std::string, size_t> by_prefix;
  for (const StateDict::Entry& entry : dict) {
    std::string prefix;
    bool is_weight = false;
    int64_t index = -1;
    if (split_name(entry.first, prefix, is_weight, index)) {
      auto [it, added] = by_prefix.emplace(prefix, candidates.size());
      if (added) candidates.push_back({prefix, {}, {}, nullptr, nullptr});
      Candidate& c = candidates[it->second];
      if (index >= 0) {
        (is_weight ? c.weights : c.biases)[index] = &entry;
      } else {
        (is_weight ? c.weight : c.bias) = &entry;
      }
    }
  }

  GroupedScan scan;
  for (const Candidate& c : candidates) {
    if (!c.weights.empty() || !c.biases.empty()) {
      check_per_expert(c, scan);
    } else if (c.weight != nullptr && c.weight->second.rank() == 3) {
      check_single(c, scan);
    }
  }
  // Each module's keys, in dict order.
  std::unordered_map<std::string, size_t> module_of;
  for (size_t i = 0; i < scan.modules.size(); ++i) module_of.emplace(scan.modules[i].prefix, i);
  for (const StateDict::Entry& entry : dict) {
    std::string prefix;
    bool is_weight = false;
    int64_t index = -1;
    if (!split_name(entry.first, prefix, is_weight, index)) continue;
    auto it = module_of.find(prefix);
    if (it == module_of.end()) continue;
    GroupedModule& m = scan.modules[it->second];
    const bool per_expert = m.layout == ExpertLayout::PerExpert;
    if ((index >= 0) == per_expert) m.keys.push_back(entry.first);
  }
  return scan;
}

std::vector<GroupedModule> find_grouped_modules(const StateDict& dict) {
  GroupedScan scan = scan_grouped_modules(dict);
  if (!scan.problems.empty()) throw scan.problems.front();
  return std::move(scan.modules);
}

uint64_t PlannedTensor::nbytes() const {
  uint64_t n = 0;
  for (const Tensor& p : pieces) n += p.nbytes();
  return n;
}

ConversionPlan plan_conversion(const StateDict& dict, ExpertLayout target) {
  ConversionPlan plan;
  plan.modules = find_grouped_modules(dict);
  // Entry name -> (module, is the module's first entry in the dict).
  std::unordered_map<std::string, std::pair<const GroupedModule*, bool>> owner;
  for (const GroupedModule& m : plan.modules) {
    for (size_t k = 0; k < m.keys.size(); ++k) owner.emplace(m.keys[k], std::pair(&m, k == 0));
  }
  for (const auto& [name, tensor] : dict) {
    auto it = owner.find(name);
    if (it == owner.end()) {
      plan.tensors.push_back({name, tensor.dtype(), tensor.shape(), {tensor}});
      continue;
    }
    if (!it->second.second) continue;  // emitted with the module's first entry
    const GroupedModule& m = *it->second.first;
    const std::string& p = m.prefix;
    const auto n = static_cast<size_t>(m.num_experts);
    if (m.layout == target) {  // as is, in the module's own order
      std::vector<std::string> keys;
      if (m.layout == ExpertLayout::Single) {
        keys.push_back(p + "weight");
        if (m.bias) keys.push_back(p + "bias");
      } else {
        for (size_t i = 0; i < n; ++i) keys.push_back(layout::expert_key(p, "weight", static_cast<int64_t>(i)));
        for (size_t i = 0; m.bias && i < n; ++i) keys.push_back(layout::expert_key(p, "bias", static_cast<int64_t>(i)));
      }
      for (const std::string& k : keys) {
        const Tensor& t = dict.at(k);
        plan.tensors.push_back({k, t.dtype(), t.shape(), {t}});
      }
    } else if (target == ExpertLayout::Single) {  // per-expert -> single
      PlannedTensor w{p + "weight", m.dtype, {m.num_experts, m.out_features, m.in_features}, {}};
      for (size_t i = 0; i < n; ++i) w.pieces.push_back(dict.at(layout::expert_key(p, "weight", static_cast<int64_t>(i))));
      plan.tensors.push_back(std::move(w));
      if (m.bias) {
        PlannedTensor b{p + "bias", m.bias_dtype, {m.num_experts, m.out_features}, {}};
        for (size_t i = 0; i < n; ++i) b.pieces.push_back(dict.at(layout::expert_key(p, "bias", static_cast<int64_t>(i))));
        plan.tensors.push_back(std::move(b));
      }
    } else {  // single -> per-expert
      const Tensor& w = dict.at(p + "weight");
      for (size_t i = 0; i < n; ++i) {
        Tensor e = w.select(static_cast<int64_t>(i));
        plan.tensors.push_back({layout::expert_key(p, "weight", static_cast<int64_t>(i)), e.dtype(), e.shape(), {e}});
      }
      if (m.bias) {
        const Tensor& b = dict.at(p + "bias");
        for (size_t i = 0; i < n; ++i) {
          Tensor e = b.select(static_cast<int64_t>(i));
          plan.tensors.push_back({layout::expert_key(p, "bias", static_cast<int64_t>(i)), e.dtype(), e.shape(), {e}});
        }
      }
    }
  }
  return plan;
}

}  // namespace grouplin
