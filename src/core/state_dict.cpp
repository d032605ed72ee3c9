#include "grouplin/state_dict.hpp"

#include "grouplin/error.hpp"

namespace grouplin {

void StateDict::insert(std::string name, Tensor tensor) {
  if (index_.count(name) != 0) {
    throw Error(ErrorCode::DuplicateName, "state dict already has an entry " + quote(name));
  }
  index_.emplace(name, entries_.size());
  entries_.emplace_back(std::move(name), std::move(tensor));
}

void StateDict::set(std::string name, Tensor tensor) {
  auto it = index_.find(name);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(tensor);
    return;
  }
  insert(std::move(name), std::move(tensor));
}

bool StateDict::erase(std::string_view name) {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) return false;
  size_t pos = it->second;
  index_.erase(it);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(pos));
  for (auto& [key, idx] : index_) {
    if (idx > pos) --idx;
  }
  return true;
}

const Tensor* StateDict::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const Tensor& StateDict::at(std::string_view name) const {
  const Tensor* t = find(name);
  if (t == nullptr) {
    throw Error(ErrorCode::MissingKey, "state dict has no entry " + quote(std::string(name)));
  }
  return *t;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

}  // namespace grouplin
