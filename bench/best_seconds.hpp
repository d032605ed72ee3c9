// The best wall time of a few runs, for the bench programs' side-by-side figures (these machines
// are noisy: the best of several runs of each variant, interleaved, is what they compare).
#pragma once

#include <algorithm>
#include <chrono>

// Seconds of the fastest of `reps` calls of f.
template <class F>
double best_seconds(int reps, const F& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t = std::chrono::steady_clock::now();
    f();
    best =
        std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}
