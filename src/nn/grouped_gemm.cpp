// The stateless grouped GEMM (grouplin/grouped_gemm.hpp): every argument checked, then the
// kernels. GroupedLinear checks its inputs with the same functions (grouped_args.hpp).
#include "grouplin/grouped_gemm.hpp"

#include <string>

#include "core/fp8.hpp"
#include "grouplin/error.hpp"
#include "kernels/grouped_gemm.hpp"
#include "nn/grouped_args.hpp"

namespace grouplin {
namespace detail {

void check_rows(const char* op, const char* what, const Tensor& t, int64_t rows, int64_t cols,
                DType dtype) {
  if (!t.defined()) {
    throw Error(ErrorCode::UndefinedTensor, std::string(op) + ": " + what + " is undefined");
  }
  if (t.rank() != 2 || (rows >= 0 && t.dim(0) != rows) || t.dim(1) != cols) {
    throw Error(ErrorCode::ShapeMismatch,
                std::string(op) + ": " + what + " has shape " + shape_to_string(t.shape()) +
                    ", expected [" + (rows >= 0 ? std::to_string(rows) : std::string("T")) + ", " +
                    std::to_string(cols) + "]");
  }
  if (t.dtype() != dtype) {
    throw Error(ErrorCode::DTypeMismatch, std::string(op) + ": " + what + " is " +
                                              std::string(dtype_name(t.dtype())) + ", expected " +
                                              std::string(dtype_name(dtype)));
  }
}

void check_splits(const char* op, std::span<const int64_t> m_splits, int64_t experts,
                  int64_t rows) {
  if (static_cast<int64_t>(m_splits.size()) != experts) {
    throw Error(ErrorCode::SplitCountMismatch,
                std::string(op) + ": m_splits has " + std::to_string(m_splits.size()) +
                    " entries, expected one per expert, " + std::to_string(experts));
  }
  // Every entry is checked for sign before any is summed, so a negative entry is reported as
  // such even after one that already overshoots T.
  for (size_t i = 0; i < m_splits.size(); ++i) {
    if (m_splits[i] < 0) {
      throw Error(ErrorCode::NegativeSplit, std::string(op) + ": m_splits[" + std::to_string(i) +
                                                "] is " + std::to_string(m_splits[i]) +
                                                ", expected >= 0");
    }
  }
  int64_t sum = 0;
  bool overflow = false;
  for (int64_t m : m_splits) overflow |= __builtin_add_overflow(sum, m, &sum);
  if (overflow || sum != rows) {
    throw Error(ErrorCode::SplitSumMismatch,
                std::string(op) + ": m_splits sum to " +
                    (overflow ? std::string("more than 2^63") : std::to_string(sum)) +
                    ", expected T = " + std::to_string(rows) + " (rows of x)");
  }
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a.data()), pb = reinterpret_cast<uintptr_t>(b.data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

ExpertShapes check_experts(const char* op, const ExpertWeights& w) {
  ExpertShapes s;
  s.n = static_cast<int64_t>(w.weights.size());
  if (s.n == 0) {
    throw Error(ErrorCode::InvalidArgument, std::string(op) + ": no experts (weights is empty)");
  }
  const Tensor& first = w.weights[0];
  if (!first.defined() || first.rank() != 2) {
    throw Error(ErrorCode::ShapeMismatch,
                std::string(op) + ": weights[0] has shape " +
                    (first.defined() ? shape_to_string(first.shape()) : "<undefined>") +
                    ", expected [out, in]");
  }
  s.out = first.dim(0);
  s.in = first.dim(1);
  s.dtype = first.dtype();
  if (s.dtype != DType::F32 && s.dtype != DType::BF16 && s.dtype != DType::F8_E4M3) {
    throw Error(ErrorCode::UnsupportedDType, std::string(op) + ": weights are " +
                                                 std::string(dtype_name(s.dtype)) +
                                                 ", expected F32, BF16 or F8_E4M3");
  }
  const bool fp8 = s.dtype == DType::F8_E4M3;
  if (fp8 ? w.scales.size() != w.weights.size() : !w.scales.empty()) {
    throw Error(ErrorCode::InvalidArgument,
                std::string(op) + ": " + std::to_string(w.scales.size()) + " scale tensors for " +
                    std::to_string(s.n) + " weights of " + std::string(dtype_name(s.dtype)) +
                    "; expected " + (fp8 ? "one per expert" : "none"));
  }
  if (!w.biases.empty() && w.biases.size() != w.weights.size()) {
    throw Error(ErrorCode::InvalidArgument,
                std::string(op) + ": " + std::to_string(w.biases.size()) + " biases for " +
                    std::to_string(s.n) + " experts; expected one per expert, or none");
  }
  for (int64_t i = 0; i < s.n; ++i) {
    std::string weight = "weights[", scale = "scales[";  // appended: GCC 12's -Wrestrict
    weight += std::to_string(i);
    weight += ']';
    scale += std::to_string(i);
    scale += ']';
    detail::check_rows(op, weight.c_str(), w.weights[static_cast<size_t>(i)], s.out, s.in, s.dtype);
    if (fp8) {
      detail::check_rows(op, scale.c_str(), w.scales[static_cast<size_t>(i)],
                         (s.out + core::kFp8Block - 1) / core::kFp8Block,
                         (s.in + core::kFp8Block - 1) / core::kFp8Block, DType::F32);
    }
  }
  return s;
}

DType check_activations(const char* op, const ExpertShapes& s, const Tensor& x) {
  if (!x.defined()) throw Error(ErrorCode::UndefinedTensor, std::string(op) + ": x is undefined");
  const DType a = s.dtype == DType::F8_E4M3 && x.dtype() == DType::F32 ? DType::F32
                  : s.dtype == DType::F8_E4M3                          ? DType::BF16
                                                                       : s.dtype;
  detail::check_rows(op, "x", x, -1, s.in, a);
  return a;
}

void check_biases(const char* op, const ExpertWeights& w, const ExpertShapes& s, DType a) {
  for (size_t i = 0; i < w.biases.size(); ++i) {
    const Tensor& b = w.biases[i];
    const std::string what = std::string(op) + ": biases[" + std::to_string(i) + "]";
    if (!b.defined() || b.rank() != 1 || b.dim(0) != s.out) {
      throw Error(ErrorCode::ShapeMismatch,
                  what + " has shape " +
                      (b.defined() ? shape_to_string(b.shape()) : "<undefined>") + ", expected [" +
                      std::to_string(s.out) + "]");
    }
    if (b.dtype() != a) {
      throw Error(ErrorCode::DTypeMismatch, what + " is " + std::string(dtype_name(b.dtype())) +
                                                ", expected " + std::string(dtype_name(a)));
    }
  }
}

}  // namespace detail

namespace {

using detail::check_activations;
using detail::check_biases;
using Shapes = detail::ExpertShapes;

Shapes check_weights(const char* op, const ExpertWeights& w) {
  return detail::check_experts(op, w);
}

}  // namespace

ExpertWeights ExpertWeights::stacked(const Tensor& weight, const Tensor& scales,
                                     const Tensor& bias) {
  const char* op = "ExpertWeights::stacked";
  if (!weight.defined() || weight.rank() != 3) {
    throw Error(ErrorCode::ShapeMismatch,
                std::string(op) + ": weight has shape " +
                    (weight.defined() ? shape_to_string(weight.shape()) : "<undefined>") +
                    ", expected [N, out, in]");
  }
  ExpertWeights w;
  for (int64_t i = 0; i < weight.dim(0); ++i) {
    w.weights.push_back(weight.select(i));
    if (scales.defined()) {
      if (scales.rank() != 3 || scales.dim(0) != weight.dim(0)) {
        throw Error(ErrorCode::ShapeMismatch,
                    std::string(op) + ": scales have shape " + shape_to_string(scales.shape()) +
                        ", expected [N, rows, cols] with N = " + std::to_string(weight.dim(0)));
      }
      w.scales.push_back(scales.select(i));
    }
    if (bias.defined()) {
      if (bias.rank() != 2 || bias.dim(0) != weight.dim(0)) {
        throw Error(ErrorCode::ShapeMismatch,
                    std::string(op) + ": bias has shape " + shape_to_string(bias.shape()) +
                        ", expected [N, out] with N = " + std::to_string(weight.dim(0)));
      }
      w.biases.push_back(bias.select(i));
    }
  }
  return w;
}

Tensor grouped_linear_forward(const Tensor& x, std::span<const int64_t> m_splits,
                              const ExpertWeights& w) {
  const Shapes s = check_weights("grouped_linear_forward", w);
  const DType a = check_activations("grouped_linear_forward", s, x);
  Tensor y = Tensor::empty({x.dim(0), s.out}, a);
  grouped_linear_forward(x, m_splits, w, y);
  return y;
}

void grouped_linear_forward(const Tensor& x, std::span<const int64_t> m_splits,
                            const ExpertWeights& w, Tensor& y) {
  const char* op = "grouped_linear_forward";
  const Shapes s = check_weights(op, w);
  const DType a = check_activations(op, s, x);
  check_biases(op, w, s, a);
  detail::check_splits(op, m_splits, s.n, x.dim(0));
  detail::check_rows(op, "y", y, x.dim(0), s.out, a);
  if (!y.writable()) throw Error(ErrorCode::ReadOnlyTensor, std::string(op) + ": y is read-only");
  if (detail::overlap(y, x)) {
    throw Error(ErrorCode::InvalidArgument,
                std::string(op) + ": y shares bytes with x; expected its own");
  }
  kernels::grouped_forward(x, m_splits, w.weights, w.scales, w.biases, y);
}

GroupedGrads grouped_linear_backward(const Tensor& x, const Tensor& dy,
                                     std::span<const int64_t> m_splits, const ExpertWeights& w,
                                     GradsWanted wanted) {
  const char* op = "grouped_linear_backward";
  const Shapes s = check_weights(op, w);
  const DType a = check_activations(op, s, x);
  check_biases(op, w, s, a);
  detail::check_splits(op, m_splits, s.n, x.dim(0));
  detail::check_rows(op, "dy", dy, x.dim(0), s.out, a);
  if (wanted.dw && s.dtype == DType::F8_E4M3) {
    throw Error(ErrorCode::Fp8WeightsNotTrainable,
                std::string(op) + ": FP8 weights have no gradient; ask for dx (and db) only");
  }
  GroupedGrads g;
  if (wanted.dx) {
    g.dx = Tensor::empty({x.dim(0), s.in}, a);
    kernels::grouped_dgrad(dy, m_splits, w.weights, w.scales, g.dx);
  }
  if (wanted.dw) {
    g.dw = Tensor::empty({s.n, s.out, s.in}, s.dtype);
    std::vector<Tensor> dw;
    for (int64_t i = 0; i < s.n; ++i) dw.push_back(g.dw.select(i));
    kernels::grouped_wgrad(x, dy, m_splits, dw, /*accumulate=*/false);
  }
  if (wanted.db && !w.biases.empty()) {
    g.db = Tensor::empty({s.n, s.out}, a);
    std::vector<Tensor> db;
    for (int64_t i = 0; i < s.n; ++i) db.push_back(g.db.select(i));
    kernels::grouped_bgrad(dy, m_splits, db);
  }
  return g;
}

}  // namespace grouplin
