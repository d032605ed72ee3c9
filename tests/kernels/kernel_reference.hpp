// Scalar double-precision reference for the grouped GEMM kernels, and the tolerance check.
// Plain loops over experts, written independently of src/kernels.
//
// Tolerance: a result element is a sum of k products (+ a bias); next to each reference value we
// keep M = sum of |terms|. F32 accumulation of k + 1 terms in any order, with or without fused
// multiply-adds, is within gamma_{k+1} M (gamma_n ~ n 2^-24); we allow twice that. A BF16 result
// is additionally rounded once to an 8-bit significand: + 2^-8 |value|. Elements with M = 0 must
// be exactly zero.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grouplin/tensor.hpp"

namespace grouplin::kernel_test {

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    float f = 0;
    if (t.dtype() == DType::F32) {
      std::memcpy(&f, t.data() + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, t.data() + 2 * i, 2);
      const uint32_t bits = uint32_t{h} << 16;
      std::memcpy(&f, &bits, 4);
    }
    out[i] = f;
  }
  return out;
}

// Values with their error scale, and the number of terms in each sum.
struct Ref {
  std::vector<double> value, scale;
  int64_t terms = 0;
};

// n values drawn uniformly from [-1, 1), the same for the same seed.
inline std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Random tensor with values exactly representable in `dtype` (so both paths see the same data).
inline Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  return Tensor::from_f32(shape, random_floats(static_cast<size_t>(shape_numel(shape)), seed),
                          dtype);
}

// `code` if it is a finite E4M3 code, else (a NaN code, 0x7f or 0xff) its neighbour 0x7e or
// 0xfe: random codes without NaNs, whose sums would tell no two orders apart.
inline uint8_t finite_e4m3(uint8_t code) { return (code & 0x7f) == 0x7f ? code ^ 1 : code; }

inline std::vector<int64_t> first_rows(std::span<const int64_t> m_splits) {
  std::vector<int64_t> first;
  int64_t row = 0;
  for (int64_t m : m_splits) {
    first.push_back(row);
    row += m;
  }
  return first;
}

// y = x · W_eᵀ + b_e for the rows of each expert.
inline Ref ref_forward(const Tensor& x, std::span<const int64_t> m_splits,
                       std::span<const Tensor> weights, std::span<const Tensor> biases,
                       int64_t out) {
  const int64_t t = x.dim(0), in = x.dim(1);
  const std::vector<double> xv = values(x);
  Ref r{std::vector<double>(static_cast<size_t>(t * out)),
        std::vector<double>(static_cast<size_t>(t * out)), in + 1};
  const std::vector<int64_t> first = first_rows(m_splits);
  for (size_t e = 0; e < m_splits.size(); ++e) {
    const std::vector<double> w = values(weights[e]);
    const std::vector<double> b =
        biases.empty() ? std::vector<double>(static_cast<size_t>(out)) : values(biases[e]);
    for (int64_t row = first[e]; row < first[e] + m_splits[e]; ++row) {
      for (int64_t o = 0; o < out; ++o) {
        double v = b[static_cast<size_t>(o)], s = std::abs(v);
        for (int64_t k = 0; k < in; ++k) {
          const double p =
              xv[static_cast<size_t>(row * in + k)] * w[static_cast<size_t>(o * in + k)];
          v += p;
          s += std::abs(p);
        }
        r.value[static_cast<size_t>(row * out + o)] = v;
        r.scale[static_cast<size_t>(row * out + o)] = s;
      }
    }
  }
  return r;
}

// dx = dy · W_e.
inline Ref ref_dgrad(const Tensor& dy, std::span<const int64_t> m_splits,
                     std::span<const Tensor> weights, int64_t in) {
  const int64_t t = dy.dim(0), out = dy.dim(1);
  const std::vector<double> g = values(dy);
  Ref r{std::vector<double>(static_cast<size_t>(t * in)),
        std::vector<double>(static_cast<size_t>(t * in)), out};
  const std::vector<int64_t> first = first_rows(m_splits);
  for (size_t e = 0; e < m_splits.size(); ++e) {
    const std::vector<double> w = values(weights[e]);
    for (int64_t row = first[e]; row < first[e] + m_splits[e]; ++row) {
      for (int64_t k = 0; k < in; ++k) {
        double v = 0, s = 0;
        for (int64_t o = 0; o < out; ++o) {
          const double p =
              g[static_cast<size_t>(row * out + o)] * w[static_cast<size_t>(o * in + k)];
          v += p;
          s += std::abs(p);
        }
        r.value[static_cast<size_t>(row * in + k)] = v;
        r.scale[static_cast<size_t>(row * in + k)] = s;
      }
    }
  }
  return r;
}

// dW_e = dy_eᵀ · x_e for one expert (plus `base` when accumulating).
inline Ref ref_wgrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> m_splits, size_t e,
                     const std::vector<double>& base = {}) {
  const int64_t in = x.dim(1), out = dy.dim(1);
  const std::vector<double> xv = values(x), g = values(dy);
  const int64_t first = first_rows(m_splits)[e];
  Ref r{std::vector<double>(static_cast<size_t>(out * in)),
        std::vector<double>(static_cast<size_t>(out * in)), m_splits[e] + 1};
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) {
      const size_t at = static_cast<size_t>(o * in + k);
      double v = base.empty() ? 0.0 : base[at], s = std::abs(v);
      for (int64_t row = first; row < first + m_splits[e]; ++row) {
        const double p =
            g[static_cast<size_t>(row * out + o)] * xv[static_cast<size_t>(row * in + k)];
        v += p;
        s += std::abs(p);
      }
      r.value[at] = v;
      r.scale[at] = s;
    }
  }
  return r;
}

// db_e = column sums of dy_e.
inline Ref ref_bgrad(const Tensor& dy, std::span<const int64_t> m_splits, size_t e) {
  const int64_t out = dy.dim(1);
  const std::vector<double> g = values(dy);
  const int64_t first = first_rows(m_splits)[e];
  Ref r{std::vector<double>(static_cast<size_t>(out)),
        std::vector<double>(static_cast<size_t>(out)), m_splits[e]};
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t row = first; row < first + m_splits[e]; ++row) {
      r.value[static_cast<size_t>(o)] += g[static_cast<size_t>(row * out + o)];
      r.scale[static_cast<size_t>(o)] += std::abs(g[static_cast<size_t>(row * out + o)]);
    }
  }
  return r;
}

// Every element of `t` within the tolerance of `ref` (first elements beyond it reported).
// `element0` / `count` select a slice of ref (for per-expert tensors).
inline ::testing::AssertionResult close_to(const Tensor& t, const Ref& ref, size_t element0 = 0) {
  const std::vector<double> got = values(t);
  const double gamma = 2.0 * static_cast<double>(ref.terms + 1) * std::ldexp(1.0, -24);
  int bad = 0;
  std::string msg;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = ref.value[element0 + i], scale = ref.scale[element0 + i];
    double tol = gamma * scale;
    if (t.dtype() == DType::BF16) tol += std::ldexp(std::abs(want), -8);
    const bool ok = scale == 0 ? got[i] == 0.0 : std::abs(got[i] - want) <= tol;
    if (!ok && ++bad <= 5) {
      msg += "\n  element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
             std::to_string(want) + " +- " + std::to_string(tol);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements off" << msg;
}

}  // namespace grouplin::kernel_test
