// StateDict: an ordered map from dotted names to tensors, as modules save and load them.
//
//   grouplin::StateDict sd;
//   grouplin::Tensor w0 = grouplin::Tensor::zeros({4, 8}, grouplin::DType::F32);
//   sd.insert("decoder.fc1.weight0", w0);        // throws DuplicateName if present
//   for (const auto& [name, tensor] : sd)        // insertion order
//     std::cout << name << " " << tensor.numel() << "\n";
//   const grouplin::Tensor* w = sd.find("decoder.fc1.weight0");
//
// Iteration follows insertion order. Copying a StateDict copies tensor views, not bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grouplin/tensor.hpp"

namespace grouplin {

class StateDict {
 public:
  using Entry = std::pair<std::string, Tensor>;

  // Adds an entry. Throws Error(DuplicateName) if `name` is already present.
  void insert(std::string name, Tensor tensor);
  // Adds or replaces an entry (a replaced entry keeps its position).
  void set(std::string name, Tensor tensor);
  // Removes an entry; returns false if absent.
  bool erase(std::string_view name);

  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // Pointer to the tensor, or nullptr if absent. Valid until the dict is modified.
  const Tensor* find(std::string_view name) const;
  // The tensor; throws Error(MissingKey) naming `name` if absent.
  const Tensor& at(std::string_view name) const;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<std::string> keys() const;
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace grouplin
