// The expert block's gate (gate.hpp): each ExpertGateKind as one function of (gate, up), forward
// and derivative, applied row by row on the kernels' threads.
#include "block/gate.hpp"

#include <algorithm>
#include <cmath>

#include "block/row_loops.hpp"
#include "grouplin/dtype.hpp"

namespace grouplin::block {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kTanhCubic = 0.044715f;

float activate(ExpertActivation act, float x) {
  switch (act) {
    case ExpertActivation::SiLU:
      return x / (1.0f + std::exp(-x));
    case ExpertActivation::GELU:
      return 0.5f * x * (1.0f + std::erf(x * kSqrtHalf));
    case ExpertActivation::GELUTanh:
      return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kTanhCubic * x * x * x)));
    case ExpertActivation::ReLU:
      return x > 0.0f ? x : 0.0f;
    case ExpertActivation::ReLU2:
      return x > 0.0f ? x * x : 0.0f;
  }
  return x;
}

float activate_slope(ExpertActivation act, float x) {
  switch (act) {
    case ExpertActivation::SiLU: {
      const float s = sigmoid(x);
      return s * (1.0f + x * (1.0f - s));
    }
    case ExpertActivation::GELU: {
      constexpr float kInvSqrt2Pi = 0.39894228040143268f;
      return 0.5f * (1.0f + std::erf(x * kSqrtHalf)) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
    }
    case ExpertActivation::GELUTanh: {
      const float u = kSqrt2OverPi * (x + kTanhCubic * x * x * x);
      const float t = std::tanh(u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kTanhCubic * x * x);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case ExpertActivation::ReLU:
      return x > 0.0f ? 1.0f : 0.0f;
    case ExpertActivation::ReLU2:
      return x > 0.0f ? 2.0f * x : 0.0f;
  }
  return 1.0f;
}

// One element of a = gate(gate, up). `r` rounds to the activations' precision where a BF16
// PyTorch tensor would be rounded (identity for F32).
template <class Round>
float gate_value(const ExpertGate& g, float gate, float up, Round r) {
  const float lim = g.limit;
  switch (g.kind) {
    case ExpertGateKind::None:
      return r(activate(g.activation, gate));
    case ExpertGateKind::Multiply:
      return r(r(activate(g.activation, gate)) * up);
    case ExpertGateKind::ClampBefore:
      return r(r(activate(g.activation, r(std::min(gate, lim)))) * r(std::clamp(up, -lim, lim)));
    case ExpertGateKind::ClampAfter:
      return r(r(std::min(r(activate(g.activation, gate)), lim)) * r(std::clamp(up, -lim, lim)));
    case ExpertGateKind::GluPlusOne: {
      const float gc = r(std::min(gate, lim)), uc = r(std::clamp(up, -lim, lim));
      const float glu = r(gc * r(sigmoid(r(gc * g.alpha))));
      return r(r(uc + 1.0f) * glu);
    }
  }
  return 0.0f;
}

struct Slopes {
  float gate = 0.0f, up = 0.0f;  // ∂a/∂gate, ∂a/∂up
};

// The derivatives of gate_value (in F32; a clamp passes the gradient where the bound holds with
// equality too, as PyTorch's clamp does).
Slopes gate_slopes(const ExpertGate& g, float gate, float up) {
  const float lim = g.limit;
  const bool gate_in = gate <= lim, up_in = up >= -lim && up <= lim;
  const float uc = std::clamp(up, -lim, lim);
  switch (g.kind) {
    case ExpertGateKind::None:
      return {activate_slope(g.activation, gate), 0.0f};
    case ExpertGateKind::Multiply:
      return {up * activate_slope(g.activation, gate), activate(g.activation, gate)};
    case ExpertGateKind::ClampBefore: {
      const float gc = std::min(gate, lim);
      return {gate_in ? uc * activate_slope(g.activation, gc) : 0.0f,
              up_in ? activate(g.activation, gc) : 0.0f};
    }
    case ExpertGateKind::ClampAfter: {
      const float act = activate(g.activation, gate);
      return {act <= lim ? uc * activate_slope(g.activation, gate) : 0.0f,
              up_in ? std::min(act, lim) : 0.0f};
    }
    case ExpertGateKind::GluPlusOne: {
      const float gc = std::min(gate, lim);
      const float s = sigmoid(g.alpha * gc);
      const float glu_slope = s + gc * g.alpha * s * (1.0f - s);
      return {gate_in ? (uc + 1.0f) * glu_slope : 0.0f, up_in ? gc * s : 0.0f};
    }
  }
  return {};
}

// Where gate and up of output column j sit in a row of h.
struct Columns {
  int64_t gate_stride = 1, up_offset = 0, up_stride = 1;
};

Columns columns(const ExpertGate& g, int64_t width) {
  if (g.kind == ExpertGateKind::None) return {1, 0, 1};
  if (g.interleaved) return {2, 1, 2};
  return {1, width, 1};
}

float round_as(float, float v) { return v; }
float round_as(uint16_t, float v) { return bf16_to_f32(f32_to_bf16(v)); }

constexpr int64_t kRowBlock = 32;

template <class T>
void forward_rows(const ExpertGate& g, const Tensor& h, Tensor& a) {
  const int64_t width = a.dim(1), in = h.dim(1);
  const Columns c = columns(g, width);
  const T* hp = h.data_as<T>();
  T* ap = a.mutable_data_as<T>();
  for_each_in_blocks(h.dim(0), kRowBlock, [&](int64_t r) {
    const T* row = hp + r * in;
    T* out = ap + r * width;
    for (int64_t j = 0; j < width; ++j) {
      const float gate = load(row, j * c.gate_stride);
      const float up =
          g.kind == ExpertGateKind::None ? 0.0f : load(row, c.up_offset + j * c.up_stride);
      store(out, j, gate_value(g, gate, up, [](float v) { return round_as(T{}, v); }));
    }
  });
}

template <class T>
void backward_rows(const ExpertGate& g, const Tensor& h, const Tensor& da, Tensor& dh) {
  const int64_t width = da.dim(1), in = h.dim(1);
  const Columns c = columns(g, width);
  const T* hp = h.data_as<T>();
  const T* dap = da.data_as<T>();
  T* dhp = dh.mutable_data_as<T>();
  for_each_in_blocks(h.dim(0), kRowBlock, [&](int64_t r) {
    const T* row = hp + r * in;
    const T* grad = dap + r * width;
    T* out = dhp + r * in;
    for (int64_t j = 0; j < width; ++j) {
      const float gate = load(row, j * c.gate_stride);
      const bool has_up = g.kind != ExpertGateKind::None;
      const float up = has_up ? load(row, c.up_offset + j * c.up_stride) : 0.0f;
      const Slopes s = gate_slopes(g, gate, up);
      const float d = load(grad, j);
      store(out, j * c.gate_stride, d * s.gate);
      if (has_up) store(out, c.up_offset + j * c.up_stride, d * s.up);
    }
  });
}

}  // namespace

int64_t gate_width(const ExpertGate& gate, int64_t first_out) {
  return gate.kind == ExpertGateKind::None ? first_out : first_out / 2;
}

void gate_forward(const ExpertGate& gate, const Tensor& h, Tensor& a) {
  if (h.dtype() == DType::BF16) {
    forward_rows<uint16_t>(gate, h, a);
  } else {
    forward_rows<float>(gate, h, a);
  }
}

void gate_backward(const ExpertGate& gate, const Tensor& h, const Tensor& da, Tensor& dh) {
  if (h.dtype() == DType::BF16) {
    backward_rows<uint16_t>(gate, h, da, dh);
  } else {
    backward_rows<float>(gate, h, da, dh);
  }
}

}  // namespace grouplin::block
