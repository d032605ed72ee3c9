// The expert block (grouplin/expert_block.hpp): checks, then routing (routing.hpp), the two
// grouped projections (the kernels of grouped_gemm.hpp, in either weight orientation), the gate
// (gate.hpp) and the combine; backward runs the same steps in reverse.
#include "grouplin/expert_block.hpp"

#include <cstring>
#include <string>

#include "block/gate.hpp"
#include "block/routing.hpp"
#include "block/row_loops.hpp"
#include "block/workspace.hpp"
#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"
#include "kernels/grouped_gemm.hpp"
#include "nn/grouped_args.hpp"

namespace grouplin {
namespace {

// The block's sizes, read from the weights in their orientation, all checked.
struct Sizes {
  int64_t experts = 0, hidden = 0, first_out = 0, width = 0;  // E, H, 2I (or I), I
  int64_t tokens = 0, top_k = 0;
  DType weights = DType::F32, act = DType::F32;
  bool fp8 = false;
};

std::string named(const char* op, const char* what) { return std::string(op) + ": " + what; }

void check_pair(const char* op, const char* what, const Tensor& t, int64_t tokens, int64_t top_k) {
  if (!t.defined()) throw Error(ErrorCode::UndefinedTensor, named(op, what) + " is undefined");
  if (t.rank() != 2 || t.dim(0) != tokens || (top_k >= 0 && t.dim(1) != top_k)) {
    throw Error(ErrorCode::ShapeMismatch,
                named(op, what) + " has shape " + shape_to_string(t.shape()) + ", expected [" +
                    std::to_string(tokens) + ", " + (top_k < 0 ? "K" : std::to_string(top_k)) +
                    "] (one row per token of hidden)");
  }
}

// top_k_index may be null (backward: the saved routing stands for it).
Sizes check(const char* op, const Tensor& hidden, const Tensor* top_k_index,
            const Tensor& top_k_weights, const ExpertBlockWeights& w, const ExpertGate& gate) {
  const std::string first_op = named(op, "first"), down_op = named(op, "down");
  const detail::ExpertShapes first = detail::check_experts(first_op.c_str(), w.first);
  const detail::ExpertShapes down = detail::check_experts(down_op.c_str(), w.down);
  Sizes s;
  s.experts = first.n;
  s.weights = first.dtype;
  s.fp8 = first.dtype == DType::F8_E4M3;
  s.hidden = w.transposed ? first.out : first.in;
  s.first_out = w.transposed ? first.in : first.out;
  if (gate.kind != ExpertGateKind::None && s.first_out % 2 != 0) {
    throw Error(ErrorCode::InvalidArgument,
                first_op + ": " + std::to_string(s.first_out) +
                    " output features, expected an even count (gate and up) for a gated block");
  }
  s.width = block::gate_width(gate, s.first_out);
  const int64_t down_in = w.transposed ? down.out : down.in;
  const int64_t down_out = w.transposed ? down.in : down.out;
  if (down.n != s.experts || down.dtype != s.weights || down_in != s.width ||
      down_out != s.hidden) {
    throw Error(ErrorCode::ShapeMismatch,
                down_op + ": " + std::to_string(down.n) + " experts of " +
                    std::string(dtype_name(down.dtype)) + " [" + std::to_string(down_out) +
                    " out, " + std::to_string(down_in) + " in], expected " +
                    std::to_string(s.experts) + " of " + std::string(dtype_name(s.weights)) + " [" +
                    std::to_string(s.hidden) + " out, " + std::to_string(s.width) +
                    " in] to follow the first projection and the gate");
  }
  if (!hidden.defined()) throw Error(ErrorCode::UndefinedTensor, named(op, "hidden is undefined"));
  detail::ExpertShapes rows = first;
  rows.in = s.hidden;
  s.act = detail::check_activations(op, rows, hidden);
  s.tokens = hidden.dim(0);
  detail::ExpertShapes first_bias = first, down_bias = down;
  first_bias.out = s.first_out;
  down_bias.out = s.hidden;
  detail::check_biases(first_op.c_str(), w.first, first_bias, s.act);
  detail::check_biases(down_op.c_str(), w.down, down_bias, s.act);
  if (top_k_index != nullptr) {
    check_pair(op, "top_k_index", *top_k_index, s.tokens, -1);
    s.top_k = top_k_index->dim(1);
    if (top_k_index->dtype() != DType::I64 && top_k_index->dtype() != DType::I32) {
      throw Error(ErrorCode::DTypeMismatch, named(op, "top_k_index is ") +
                                                std::string(dtype_name(top_k_index->dtype())) +
                                                ", expected I64 or I32");
    }
  }
  check_pair(op, "top_k_weights", top_k_weights, s.tokens, top_k_index ? s.top_k : -1);
  s.top_k = top_k_weights.dim(1);
  const DType kw = top_k_weights.dtype();
  if (kw != DType::F32 && kw != DType::BF16 && kw != DType::F16) {
    throw Error(ErrorCode::DTypeMismatch, named(op, "top_k_weights is ") +
                                              std::string(dtype_name(kw)) +
                                              ", expected F32, BF16 or F16");
  }
  return s;
}

using block::load;
using block::store;

// Element access for the routing weights' three dtypes.
float routing_weight(const Tensor& w, int64_t slot) {
  switch (w.dtype()) {
    case DType::BF16:
      return bf16_to_f32(w.data_as<uint16_t>()[slot]);
    case DType::F16:
      return f16_to_f32(w.data_as<uint16_t>()[slot]);
    default:
      return w.data_as<float>()[slot];
  }
}

void store_routing(Tensor& w, int64_t slot, float v) {
  switch (w.dtype()) {
    case DType::BF16:
      w.mutable_data_as<uint16_t>()[slot] = f32_to_bf16(v);
      break;
    case DType::F16:
      w.mutable_data_as<uint16_t>()[slot] = f32_to_f16(v);
      break;
    default:
      w.mutable_data_as<float>()[slot] = v;
  }
}

// xs [R, H]: the token row of each routed row.
void gather(const Tensor& hidden, const block::Routing& r, Tensor& xs) {
  const size_t row_bytes = static_cast<size_t>(hidden.dim(1)) * dtype_size(hidden.dtype());
  const std::byte* from = hidden.data();
  std::byte* to = xs.mutable_data();
  block::for_each_in_blocks(r.rows(), 64, [&](int64_t row) {
    const int64_t token = r.slot_of_row[static_cast<size_t>(row)] / r.top_k;
    std::memcpy(to + static_cast<size_t>(row) * row_bytes,
                from + static_cast<size_t>(token) * row_bytes, row_bytes);
  });
}

std::vector<Tensor> stacked_views(Tensor& t) {
  std::vector<Tensor> views;
  for (int64_t i = 0; i < t.dim(0); ++i) views.push_back(t.select(i));
  return views;
}

// y[row] += the bias of the row's expert (an F32 sum, rounded to y's dtype, which the biases
// share).
template <class T>
void add_biases(const block::Routing& r, const ExpertWeights& w, Tensor& y) {
  std::vector<int64_t> expert_of_row;
  for (size_t e = 0; e < r.m_splits.size(); ++e) {
    expert_of_row.insert(expert_of_row.end(), static_cast<size_t>(r.m_splits[e]),
                         static_cast<int64_t>(e));
  }
  const int64_t out = y.dim(1);
  T* yp = y.mutable_data_as<T>();
  block::for_each_in_blocks(y.dim(0), 32, [&](int64_t row) {
    const size_t e = static_cast<size_t>(expert_of_row[static_cast<size_t>(row)]);
    const T* b = w.biases[e].data_as<T>();
    for (int64_t j = 0; j < out; ++j)
      store(yp + row * out, j, load(yp + row * out, j) + load(b, j));
  });
}

// y [R, out] = x · Wᵀ (+ b) for each expert's rows; weights stored [in, out] when transposed.
void project(const Tensor& x, const block::Routing& r, const ExpertWeights& w, bool transposed,
             Tensor& y) {
  if (!transposed) {
    kernels::grouped_forward(x, r.m_splits, w.weights, w.scales, w.biases, y);
    return;
  }
  // x · Wt is the product dgrad computes for a weight [out', in'] = Wt.
  kernels::grouped_dgrad(x, r.m_splits, w.weights, w.scales, y);
  if (w.biases.empty()) return;
  if (y.dtype() == DType::BF16) {
    add_biases<uint16_t>(r, w, y);
  } else {
    add_biases<float>(r, w, y);
  }
}

// dx [R, in] = dy · W for each expert's rows (the transpose of project).
void project_back(const Tensor& dy, const block::Routing& r, const ExpertWeights& w,
                  bool transposed, Tensor& dx) {
  if (!transposed) {
    kernels::grouped_dgrad(dy, r.m_splits, w.weights, w.scales, dx);
  } else {
    kernels::grouped_forward(dy, r.m_splits, w.weights, w.scales, {}, dx);
  }
}

// dW (stacked, in the weights' orientation) of y = x · Wᵀ for gradient dy.
Tensor weight_grad(const Tensor& x, const Tensor& dy, const block::Routing& r, DType dtype,
                   bool transposed) {
  const int64_t experts = static_cast<int64_t>(r.m_splits.size());
  // Every element is written (experts without rows get zeros).
  Tensor dw = transposed ? Tensor::empty({experts, x.dim(1), dy.dim(1)}, dtype)
                         : Tensor::empty({experts, dy.dim(1), x.dim(1)}, dtype);
  std::vector<Tensor> views = stacked_views(dw);
  if (transposed) {
    kernels::grouped_wgrad(dy, x, r.m_splits, views, /*accumulate=*/false);
  } else {
    kernels::grouped_wgrad(x, dy, r.m_splits, views, /*accumulate=*/false);
  }
  return dw;
}

Tensor bias_grad(const Tensor& dy, const block::Routing& r) {
  Tensor db = Tensor::empty({static_cast<int64_t>(r.m_splits.size()), dy.dim(1)}, dy.dtype());
  std::vector<Tensor> views = stacked_views(db);
  kernels::grouped_bgrad(dy, r.m_splits, views);
  return db;
}

// out[t] = Σ_k weight(t, k) · y[row(t, k)] in F32, in slot order; each product rounded to BF16
// first when both factors are BF16 (as PyTorch multiplies two BF16 tensors).
template <class T>
void combine(const Tensor& y, const Tensor& weights, const block::Routing& r, Tensor& out) {
  const int64_t width = y.dim(1);
  const bool round_products = y.dtype() == DType::BF16 && weights.dtype() == DType::BF16;
  const T* yp = y.data_as<T>();
  T* op = out.mutable_data_as<T>();
  block::for_each_in_blocks(r.tokens, 4, [&](int64_t t) {
    std::vector<float> acc(static_cast<size_t>(width), 0.0f);
    for (int64_t k = 0; k < r.top_k; ++k) {
      const int64_t slot = t * r.top_k + k, row = r.row_of_slot[static_cast<size_t>(slot)];
      if (row < 0) continue;
      const float w = routing_weight(weights, slot);
      const T* src = yp + row * width;
      for (int64_t j = 0; j < width; ++j) {
        float p = load(src, j) * w;
        if (round_products) p = bf16_to_f32(f32_to_bf16(p));
        acc[static_cast<size_t>(j)] += p;
      }
    }
    for (int64_t j = 0; j < width; ++j) store(op + t * width, j, acc[static_cast<size_t>(j)]);
  });
}

// dy[row] = weight(slot) · d_out[token], rounded to the activations' dtype.
template <class T>
void spread(const Tensor& d_out, const Tensor& weights, const block::Routing& r, Tensor& dy) {
  const int64_t width = d_out.dim(1);
  const T* gp = d_out.data_as<T>();
  T* dp = dy.mutable_data_as<T>();
  block::for_each_in_blocks(r.rows(), 16, [&](int64_t row) {
    const int64_t slot = r.slot_of_row[static_cast<size_t>(row)];
    const float w = routing_weight(weights, slot);
    const T* g = gp + (slot / r.top_k) * width;
    for (int64_t j = 0; j < width; ++j) store(dp + row * width, j, load(g, j) * w);
  });
}

// d weight(t, k) = y[row(t, k)] · d_out[t] in F32 in column order; zero for sentinel slots.
template <class T>
Tensor routing_weight_grad(const Tensor& d_out, const Tensor& y, const Tensor& weights,
                           const block::Routing& r) {
  Tensor d = Tensor::empty(weights.shape(), weights.dtype());
  const int64_t width = d_out.dim(1);
  const T* gp = d_out.data_as<T>();
  const T* yp = y.data_as<T>();
  block::for_each_in_blocks(r.tokens, 16, [&](int64_t t) {
    for (int64_t k = 0; k < r.top_k; ++k) {
      const int64_t slot = t * r.top_k + k, row = r.row_of_slot[static_cast<size_t>(slot)];
      float sum = 0.0f;
      for (int64_t j = 0; row >= 0 && j < width; ++j) {
        sum += load(yp + row * width, j) * load(gp + t * width, j);
      }
      store_routing(d, slot, sum);
    }
  });
  return d;
}

// d hidden[t] = Σ_k dxs[row(t, k)] in F32, in slot order.
template <class T>
Tensor gather_back(const Tensor& dxs, const block::Routing& r) {
  const int64_t width = dxs.dim(1);
  Tensor d = Tensor::empty({r.tokens, width}, dxs.dtype());
  const T* sp = dxs.data_as<T>();
  T* dp = d.mutable_data_as<T>();
  block::for_each_in_blocks(r.tokens, 4, [&](int64_t t) {
    std::vector<float> acc(static_cast<size_t>(width), 0.0f);
    for (int64_t k = 0; k < r.top_k; ++k) {
      const int64_t row = r.row_of_slot[static_cast<size_t>(t * r.top_k + k)];
      if (row < 0) continue;
      for (int64_t j = 0; j < width; ++j) acc[static_cast<size_t>(j)] += load(sp + row * width, j);
    }
    for (int64_t j = 0; j < width; ++j) store(dp + t * width, j, acc[static_cast<size_t>(j)]);
  });
  return d;
}

}  // namespace

ExpertBlockResult expert_block_forward(const Tensor& hidden, const Tensor& top_k_index,
                                       const Tensor& top_k_weights, const ExpertBlockWeights& w,
                                       const ExpertGate& gate, bool save) {
  const Sizes s = check("expert_block_forward", hidden, &top_k_index, top_k_weights, w, gate);
  const block::Routing r = block::route(top_k_index, s.experts);
  const Shape xs_shape{r.rows(), s.hidden}, h_shape{r.rows(), s.first_out},
      a_shape{r.rows(), s.width};
  // h and y are kept for backward when saving, else they live in the workspace too.
  const size_t kept = save ? 0
                           : block::Workspace::bytes_for(h_shape, s.act) +
                                 block::Workspace::bytes_for(xs_shape, s.act);
  block::Workspace ws(block::Workspace::bytes_for(xs_shape, s.act) +
                      block::Workspace::bytes_for(a_shape, s.act) + kept);
  Tensor xs = ws.take(xs_shape, s.act);
  gather(hidden, r, xs);
  Tensor h = save ? Tensor::empty(h_shape, s.act) : ws.take(h_shape, s.act);
  project(xs, r, w.first, w.transposed, h);
  Tensor a = ws.take(a_shape, s.act);
  block::gate_forward(gate, h, a);
  Tensor y = save ? Tensor::empty(xs_shape, s.act) : ws.take(xs_shape, s.act);
  project(a, r, w.down, w.transposed, y);
  ExpertBlockResult result;
  result.out = Tensor::empty({s.tokens, s.hidden}, s.act);
  if (s.act == DType::BF16) {
    combine<uint16_t>(y, top_k_weights, r, result.out);
  } else {
    combine<float>(y, top_k_weights, r, result.out);
  }
  if (save) {
    result.saved = {r.m_splits, r.row_of_slot, std::move(h), std::move(y)};
  }
  return result;
}

ExpertBlockGrads expert_block_backward(const Tensor& d_out, const Tensor& hidden,
                                       const Tensor& top_k_weights, const ExpertBlockWeights& w,
                                       const ExpertGate& gate, const ExpertBlockSaved& saved,
                                       ExpertBlockGradsWanted wanted) {
  const char* op = "expert_block_backward";
  const Sizes s = check(op, hidden, nullptr, top_k_weights, w, gate);
  detail::check_rows(op, "d_out", d_out, s.tokens, s.hidden, s.act);
  if (wanted.weights && s.fp8) {
    throw Error(ErrorCode::Fp8WeightsNotTrainable,
                std::string(op) + ": FP8 weights have no gradient; ask for weights = false");
  }
  int64_t routed = 0;
  bool splits_ok = static_cast<int64_t>(saved.m_splits.size()) == s.experts;
  for (int64_t m : saved.m_splits) {
    splits_ok = splits_ok && m >= 0;
    routed += m;
  }
  if (!splits_ok || static_cast<int64_t>(saved.row_of_slot.size()) != s.tokens * s.top_k ||
      !saved.h.defined() || !saved.y.defined()) {
    throw Error(ErrorCode::BackwardBeforeForward,
                std::string(op) +
                    ": `saved` does not come from a forward of these shapes with "
                    "save = true (" +
                    std::to_string(saved.m_splits.size()) + " experts, " +
                    std::to_string(saved.row_of_slot.size()) + " slots; expected " +
                    std::to_string(s.experts) + " and " + std::to_string(s.tokens * s.top_k) + ")");
  }
  detail::check_rows(op, "saved.h", saved.h, routed, s.first_out, s.act);
  detail::check_rows(op, "saved.y", saved.y, routed, s.hidden, s.act);
  const block::Routing r =
      block::route_from_rows(s.tokens, s.top_k, saved.m_splits, saved.row_of_slot);
  for (int64_t slot : r.slot_of_row) {
    if (slot < 0) {
      throw Error(ErrorCode::BackwardBeforeForward,
                  std::string(op) + ": saved.row_of_slot leaves a routed row without its slot");
    }
  }

  const bool bf16 = s.act == DType::BF16;
  ExpertBlockGrads g;
  if (wanted.top_k_weights) {
    g.top_k_weights = bf16 ? routing_weight_grad<uint16_t>(d_out, saved.y, top_k_weights, r)
                           : routing_weight_grad<float>(d_out, saved.y, top_k_weights, r);
  }
  if (!wanted.hidden && !wanted.weights && !wanted.biases) return g;
  const Shape rows_h{r.rows(), s.hidden}, rows_i{r.rows(), s.width},
      rows_first{r.rows(), s.first_out};
  block::Workspace ws(3 * block::Workspace::bytes_for(rows_h, s.act) +
                      2 * block::Workspace::bytes_for(rows_i, s.act) +
                      block::Workspace::bytes_for(rows_first, s.act));
  Tensor dy = ws.take(rows_h, s.act);
  if (bf16) {
    spread<uint16_t>(d_out, top_k_weights, r, dy);
  } else {
    spread<float>(d_out, top_k_weights, r, dy);
  }
  Tensor a = ws.take(rows_i, s.act);
  block::gate_forward(gate, saved.h, a);
  if (wanted.weights) g.down = weight_grad(a, dy, r, s.weights, w.transposed);
  if (wanted.biases && !w.down.biases.empty()) g.down_bias = bias_grad(dy, r);
  Tensor da = ws.take(rows_i, s.act);
  project_back(dy, r, w.down, w.transposed, da);
  Tensor dh = ws.take(rows_first, s.act);
  block::gate_backward(gate, saved.h, da, dh);
  if (wanted.weights) {
    Tensor xs = ws.take(rows_h, s.act);
    gather(hidden, r, xs);
    g.first = weight_grad(xs, dh, r, s.weights, w.transposed);
  }
  if (wanted.biases && !w.first.biases.empty()) g.first_bias = bias_grad(dh, r);
  if (wanted.hidden) {
    Tensor dxs = ws.take(rows_h, s.act);
    project_back(dh, r, w.first, w.transposed, dxs);
    g.hidden = bf16 ? gather_back<uint16_t>(dxs, r) : gather_back<float>(dxs, r);
  }
  return g;
}

}  // namespace grouplin
