// Double-precision per-expert reference for GroupedLinear, and the tolerance check that compares
// the library's results with it. Plain loops, written independently of src/kernels.
//
//   Experts ex = experts_of(layer);
//   Ref y = ref_forward(to_double(x), m_splits, ex);
//   EXPECT_TRUE(close_to(layer.forward(x, m_splits), y));
//
// Tolerance. Every reference element is a sum of k products (plus a bias), and we keep, next to
// each value, M = sum of |products| (+ |bias|). The library computes in F32 from inputs that are
// already in the params dtype (BF16 inputs widen exactly), so the only errors are
//   * F32 accumulation of k + 1 terms in any order (with or without FMA):
//       |err| <= gamma_{k+1} * M,  gamma_n ~= n * 2^-24;
//   * for BF16 outputs, one final round to nearest of an 8-bit significand: <= 2^-8 * |value|.
// We allow twice the first bound plus the second:
//     F32:  tol = 2 * (k + 1) * 2^-24 * M
//     BF16: tol = 2 * (k + 1) * 2^-24 * M + 2^-8 * |value|
// The BF16 reference is computed from the BF16-rounded inputs (the tensors the layer really
// sees), so the BF16 tolerance is relative to the magnitude of each element, not to a worst case.
// A wrong expert (another expert's weights, a transposed weight, a row-range shifted by one)
// changes elements by O(M), orders of magnitude above these bounds; grouped_linear_test checks
// that the comparison rejects such mistakes. An element with M = 0 (an expert with no rows) must
// be exactly zero.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <vector>

#include "grouplin/grouped_linear.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::reference {

// A tensor's values as doubles. Widens F32 and BF16 bits directly (not through the library).
inline std::vector<double> to_double(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    float f = 0.0f;
    if (t.dtype() == DType::F32) {
      std::memcpy(&f, t.data() + 4 * i, 4);
    } else if (t.dtype() == DType::BF16) {
      uint16_t h = 0;
      std::memcpy(&h, t.data() + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&f, &bits, 4);
    } else {
      ADD_FAILURE() << "to_double: unsupported dtype " << dtype_name(t.dtype());
    }
    out[i] = f;
  }
  return out;
}

// Reference values with their error scale.
struct Ref {
  Shape shape;
  std::vector<double> value;
  std::vector<double> magnitude;  // sum of |terms| of each element
  int64_t terms = 0;              // most terms summed into one element
};

// The experts' parameters in double, row-major: w[e] is [out, in], b[e] is [out] (empty: no bias).
struct Experts {
  int64_t in = 0, out = 0;
  std::vector<std::vector<double>> w, b;
};

inline Experts experts_of(const GroupedLinear& layer) {
  Experts ex;
  ex.in = layer.options().in_features;
  ex.out = layer.options().out_features;
  for (int64_t e = 0; e < layer.num_gemms(); ++e) {
    ex.w.push_back(to_double(layer.expert_weight(e)));
    ex.b.push_back(layer.options().bias ? to_double(layer.expert_bias(e)) : std::vector<double>{});
  }
  return ex;
}

// First row of each expert.
inline std::vector<int64_t> row_starts(std::span<const int64_t> m_splits) {
  std::vector<int64_t> starts;
  int64_t row = 0;
  for (int64_t m : m_splits) {
    starts.push_back(row);
    row += m;
  }
  return starts;
}

// y [T, out]: y[r, o] = sum_k x[r, k] * w_e[o, k] + b_e[o] for rows r of expert e.
inline Ref ref_forward(const std::vector<double>& x, std::span<const int64_t> m_splits,
                       const Experts& ex) {
  const int64_t t = static_cast<int64_t>(x.size()) / ex.in;
  Ref r{{t, ex.out},
        std::vector<double>(static_cast<size_t>(t * ex.out)),
        std::vector<double>(static_cast<size_t>(t * ex.out)),
        ex.in + 1};
  const auto starts = row_starts(m_splits);
  for (size_t e = 0; e < m_splits.size(); ++e) {
    for (int64_t row = starts[e]; row < starts[e] + m_splits[e]; ++row) {
      for (int64_t o = 0; o < ex.out; ++o) {
        double s = ex.b[e].empty() ? 0.0 : ex.b[e][static_cast<size_t>(o)];
        double m = std::abs(s);
        for (int64_t k = 0; k < ex.in; ++k) {
          const double p =
              x[static_cast<size_t>(row * ex.in + k)] * ex.w[e][static_cast<size_t>(o * ex.in + k)];
          s += p;
          m += std::abs(p);
        }
        r.value[static_cast<size_t>(row * ex.out + o)] = s;
        r.magnitude[static_cast<size_t>(row * ex.out + o)] = m;
      }
    }
  }
  return r;
}

// dx [T, in]: dx[r, k] = sum_o dy[r, o] * w_e[o, k].
inline Ref ref_dgrad(const std::vector<double>& dy, std::span<const int64_t> m_splits,
                     const Experts& ex) {
  const int64_t t = static_cast<int64_t>(dy.size()) / ex.out;
  Ref r{{t, ex.in},
        std::vector<double>(static_cast<size_t>(t * ex.in)),
        std::vector<double>(static_cast<size_t>(t * ex.in)),
        ex.out};
  const auto starts = row_starts(m_splits);
  for (size_t e = 0; e < m_splits.size(); ++e) {
    for (int64_t row = starts[e]; row < starts[e] + m_splits[e]; ++row) {
      for (int64_t k = 0; k < ex.in; ++k) {
        double s = 0.0, m = 0.0;
        for (int64_t o = 0; o < ex.out; ++o) {
          const double p = dy[static_cast<size_t>(row * ex.out + o)] *
                           ex.w[e][static_cast<size_t>(o * ex.in + k)];
          s += p;
          m += std::abs(p);
        }
        r.value[static_cast<size_t>(row * ex.in + k)] = s;
        r.magnitude[static_cast<size_t>(row * ex.in + k)] = m;
      }
    }
  }
  return r;
}

// dW_e [out, in]: dW[o, k] = sum over expert e's rows r of dy[r, o] * x[r, k].
inline Ref ref_wgrad(const std::vector<double>& x, const std::vector<double>& dy,
                     std::span<const int64_t> m_splits, size_t e, int64_t in, int64_t out) {
  Ref r{{out, in},
        std::vector<double>(static_cast<size_t>(out * in)),
        std::vector<double>(static_cast<size_t>(out * in)),
        m_splits[e]};
  const int64_t start = row_starts(m_splits)[e];
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) {
      double s = 0.0, m = 0.0;
      for (int64_t row = start; row < start + m_splits[e]; ++row) {
        const double p =
            dy[static_cast<size_t>(row * out + o)] * x[static_cast<size_t>(row * in + k)];
        s += p;
        m += std::abs(p);
      }
      r.value[static_cast<size_t>(o * in + k)] = s;
      r.magnitude[static_cast<size_t>(o * in + k)] = m;
    }
  }
  return r;
}

// db_e [out]: column sums of expert e's rows of dy.
inline Ref ref_bgrad(const std::vector<double>& dy, std::span<const int64_t> m_splits, size_t e,
                     int64_t out) {
  Ref r{{out},
        std::vector<double>(static_cast<size_t>(out)),
        std::vector<double>(static_cast<size_t>(out)),
        m_splits[e]};
  const int64_t start = row_starts(m_splits)[e];
  for (int64_t row = start; row < start + m_splits[e]; ++row) {
    for (int64_t o = 0; o < out; ++o) {
      r.value[static_cast<size_t>(o)] += dy[static_cast<size_t>(row * out + o)];
      r.magnitude[static_cast<size_t>(o)] += std::abs(dy[static_cast<size_t>(row * out + o)]);
    }
  }
  return r;
}

// a + b elementwise (two accumulated gradients): terms add, plus one for the final addition.
inline Ref ref_sum(const Ref& a, const Ref& b) {
  Ref r = a;
  for (size_t i = 0; i < r.value.size(); ++i) {
    r.value[i] += b.value[i];
    r.magnitude[i] += b.magnitude[i];
  }
  r.terms = a.terms + b.terms + 1;
  return r;
}

// Allowed |got - value| for one element (see the file comment).
inline double tolerance(const Ref& r, size_t i, DType dtype) {
  constexpr double kF32Unit = 1.0 / (1 << 24);  // 2^-24
  constexpr double kBF16Unit = 1.0 / (1 << 8);  // 2^-8
  double tol = 2.0 * static_cast<double>(r.terms + 1) * kF32Unit * r.magnitude[i];
  if (dtype == DType::BF16) tol += kBF16Unit * std::abs(r.value[i]);
  return tol;
}

// Success when `got` has the reference's shape and every element is within tolerance.
inline ::testing::AssertionResult close_to(const Tensor& got, const Ref& ref) {
  if (!got.defined()) return ::testing::AssertionFailure() << "tensor is undefined";
  if (got.shape() != ref.shape) {
    return ::testing::AssertionFailure() << "shape " << shape_to_string(got.shape())
                                         << ", expected " << shape_to_string(ref.shape);
  }
  const std::vector<double> g = to_double(got);
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < g.size(); ++i) {
    const double diff = std::abs(g[i] - ref.value[i]);
    if (!(diff <= tolerance(ref, i, got.dtype()))) {  // also catches NaN
      if (bad++ == 0) {
        first << "element " << i << ": got " << g[i] << ", expected " << ref.value[i]
              << " (tolerance " << tolerance(ref, i, got.dtype()) << ")";
      }
    }
  }
  if (bad != 0) {
    return ::testing::AssertionFailure()
           << bad << " of " << g.size() << " elements off; first: " << first.str();
  }
  return ::testing::AssertionSuccess();
}

}  // namespace grouplin::reference
