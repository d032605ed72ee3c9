// How `grouplin bench` times the variants of one case side by side: each repetition runs every
// variant once, in turn, and each variant keeps its best time; calls shorter than a few
// milliseconds are timed in batches. Shared by the F32/BF16 cases (bench_run.cpp) and the FP8
// ones (bench_fp8.cpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grouplin/tensor.hpp"

namespace grouplin::bench {

// A best time not measured (the variant did not run).
inline constexpr double kNotRun = std::numeric_limits<double>::infinity();

struct Variant {
  double* best;  // the best seconds per call so far, updated in place
  std::function<void()> run;
  bool uses_blas;  // OpenBLAS threads spin after it: pause before the next variant
};

// Runs `variants` interleaved, `reps` times after two warm-up calls each (see above).
void time_variants(const std::vector<Variant>& variants, int reps);

// One goal of a run: how many cases meet it, and the worst case.
struct Goal {
  Goal(const char* text_in, double target_in) : text(text_in), target(target_in) {}

  // Counts one case's figure (ignored when not positive: the case did not run).
  void add(double value, const std::string& case_name) {
    if (value <= 0) return;
    ++total;
    if (value >= target) ++met;
    if (value < worst) {
      worst = value;
      worst_case = case_name;
    }
  }
  nlohmann::json to_json() const {
    return {{"goal", text},
            {"met", met},
            {"cases", total},
            {"worst", total ? worst : 0.0},
            {"worst_case", worst_case}};
  }
  void print() const {
    std::printf("  %-52s %3d of %3d cases; worst %.2f (%s)\n", text, met, total,
                total ? worst : 0.0, worst_case.c_str());
  }

  const char* text;
  double target;
  int met = 0, total = 0;
  double worst = std::numeric_limits<double>::infinity();
  std::string worst_case;
};

// Rows per expert for a routing: uniform (remainder to the first experts), skewed (half to expert
// 0, the rest uniform over the others), empty25 (every fourth expert empty, the rest uniform),
// one (all rows to expert 0).
std::vector<int64_t> make_splits(const std::string& routing, int64_t experts, int64_t rows);

// Deterministic F32 values in [-1, 1): cheap enough to fill gigabytes.
Tensor filled(const Shape& shape, uint64_t seed);

// The experts of a stacked [N, ...] tensor, as views.
std::vector<Tensor> experts_of(const Tensor& stacked);

// The clock the cores run at while `threads` of them are busy, in GHz, measured: each thread times
// a chain of dependent integer adds (one cycle each on every core GroupLin runs on) in 16 windows
// of about 1 ms and keeps its fastest; the mean over the threads is returned. Under a VM
// /proc/cpuinfo's "cpu MHz" is often the nominal clock, well below the boost clock the kernels run
// at, which put fractions of "peak" above 1. 0 where no such chain is written for the architecture.
double measured_clock_ghz(int threads);

// The value of the first line of /proc/cpuinfo that starts with `key` (what follows its ": "),
// or "" where there is none.
std::string cpuinfo_field(const char* key);

// The CPU, threads, kernel set, BLAS and load average, for the report's first line.
std::string machine_description();

}  // namespace grouplin::bench
