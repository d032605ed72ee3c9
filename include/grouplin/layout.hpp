// The layout vocabulary, one name per layout everywhere (API, reports, CLI, docs): how a
// checkpoint stores the experts of a grouped module, and how a GroupedLinear holds its weights.
//
//   grouplin::ExpertLayout l = *grouplin::expert_layout_from_name("single");
//   std::cout << grouplin::layout_name(l) << "\n";                       // "single"
//   grouplin::checkpoint_layout(grouplin::WeightLayout::Contiguous);      // PerExpert
//
// Names are for the edges (command line, messages, JSON); the API takes the enums.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace grouplin {

// How a checkpoint (a state dict, a file) stores the experts of one grouped module with prefix P.
enum class ExpertLayout {
  PerExpert,  // P.weight0 .. P.weight{N-1} [out, in], P.bias0 .. P.bias{N-1} [out]
  Single,     // P.weight [N, out, in], P.bias [N, out]
};

// How a GroupedLinear holds its weights in memory.
enum class WeightLayout {
  PerExpert,   // N tensors weight{i} [out, in], bias{i} [out], each its own allocation
  Contiguous,  // the same N parameters, views into one GroupedTensor
  Single,      // one weight [N, out, in], one bias [N, out]
};

// Experts [begin, end) of every grouped module: what one rank of an expert-parallel job keeps.
struct ExpertRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// "per-expert" or "single".
std::string_view layout_name(ExpertLayout layout);
// "per-expert", "contiguous" or "single".
std::string_view layout_name(WeightLayout layout);
// Parses "per-expert" or "single"; nullopt for anything else.
std::optional<ExpertLayout> expert_layout_from_name(std::string_view name);
// Parses "per-expert", "contiguous" or "single"; nullopt for anything else.
std::optional<WeightLayout> weight_layout_from_name(std::string_view name);
// The keys a module of `layout` has in its state dict: Contiguous saves as PerExpert.
ExpertLayout checkpoint_layout(WeightLayout layout);

}  // namespace grouplin
