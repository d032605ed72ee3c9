// The expert block's gate by its definition (grouplin/expert_block.hpp), in double: what the
// block tests compare GroupLin's gate with.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "grouplin/expert_block.hpp"

namespace grouplin::testing {

inline double act(ExpertActivation a, double x) {
  switch (a) {
    case ExpertActivation::SiLU:
      return x / (1 + std::exp(-x));
    case ExpertActivation::GELU:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case ExpertActivation::GELUTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case ExpertActivation::ReLU:
      return std::max(x, 0.0);
    case ExpertActivation::ReLU2:
      return x > 0 ? x * x : 0.0;
  }
  return x;
}

inline double gate_of(const ExpertGate& g, double gate, double up) {
  const double l = g.limit;
  switch (g.kind) {
    case ExpertGateKind::None:
      return act(g.activation, gate);
    case ExpertGateKind::Multiply:
      return act(g.activation, gate) * up;
    case ExpertGateKind::ClampBefore:
      return act(g.activation, std::min(gate, l)) * std::clamp(up, -l, l);
    case ExpertGateKind::ClampAfter:
      return std::min(act(g.activation, gate), l) * std::clamp(up, -l, l);
    case ExpertGateKind::GluPlusOne: {
      const double c = std::min(gate, l);
      return (std::clamp(up, -l, l) + 1) * c / (1 + std::exp(-g.alpha * c));
    }
  }
  return 0;
}

// The gates the tests run: every kind, the activations, both column orders, limits that bite.
inline std::vector<ExpertGate> gates() {
  std::vector<ExpertGate> g;
  for (ExpertActivation a :
       {ExpertActivation::SiLU, ExpertActivation::GELU, ExpertActivation::GELUTanh,
        ExpertActivation::ReLU, ExpertActivation::ReLU2}) {
    g.push_back({ExpertGateKind::Multiply, a, false});
    g.push_back({ExpertGateKind::None, a, false});
  }
  g.push_back({ExpertGateKind::Multiply, ExpertActivation::SiLU, true});
  g.push_back({ExpertGateKind::ClampBefore, ExpertActivation::SiLU, false, 0.4f});
  g.push_back({ExpertGateKind::ClampAfter, ExpertActivation::GELU, false, 0.3f});
  g.push_back({ExpertGateKind::GluPlusOne, ExpertActivation::SiLU, true, 0.5f, 1.702f});
  g.push_back({ExpertGateKind::GluPlusOne, ExpertActivation::SiLU, false, 0.7f, 1.3f});
  return g;
}

}  // namespace grouplin::testing
