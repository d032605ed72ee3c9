#include "nn/init.hpp"

#include <vector>

namespace grouplin {
namespace {

// SplitMix64: a counter-based generator, so any element can be drawn without the others.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void init_uniform(Tensor t, uint64_t seed, int64_t stream, float bound) {
  const uint64_t base = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(stream)));
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    // 24 random bits -> [0, 1) exactly representable in F32.
    const float u = static_cast<float>(splitmix64(base + i) >> 40) * (1.0f / 16777216.0f);
    values[i] = (2.0f * u - 1.0f) * bound;
  }
  convert_elements(values.data(), DType::F32, t.mutable_data(), t.dtype(), values.size());
}

}  // namespace grouplin
