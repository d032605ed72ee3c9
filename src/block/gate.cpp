// The expert block's gate (gate.hpp): each ExpertGateKind as one function of (gate, up), forward
// and derivative, applied row by row on the kernels' threads, a chunk of columns at a time.
#include "block/gate.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "block/row_loops.hpp"
#include "grouplin/dtype.hpp"

namespace grouplin::block {
namespace {

// Every helper below is inlined into the row functions at the end, which are compiled once per
// instruction set (GROUPLIN_GATE_CLONES), so that each copy's loops use that set's vectors.
#define GROUPLIN_GATE_INLINE [[gnu::always_inline]] inline
#if defined(__x86_64__) && __has_attribute(target_clones)
#define GROUPLIN_GATE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GROUPLIN_GATE_CLONES
#endif

// The gate runs over each row kChunk columns at a time: every pass below is a plain loop over one
// chunk with no branch on the data, so that the compiler turns it into vector instructions (one
// element at a time, with the C library's expf, it was a tenth of a block's forward:
// docs/PERFORMANCE.md, "The expert block's gate in vector loops"). Each element's value depends
// on that element alone, never on the chunk or where the element sits in it.
constexpr int kChunk = 64;
using Chunk = float[kChunk];

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kTanhCubic = 0.044715f;

// e^x to within ~2 ulp of the C library's expf for x in [-87, 88] (clamped there: the block's
// uses, x / (1 + e^-x) and 1 / (1 + e^-x), come out within that of their limits outside it).
// Without branches, so that loops over it vectorize: the exponent by the round-to-nearest trick
// (adding 1.5 * 2^23 leaves n in the low bits of t), e^r on |r| <= ln 2 / 2 by Cephes' degree-6
// polynomial of expf, 2^n by building the float's exponent field (n in [-126, 127] after the
// clamp: a normal float). n's bits come from t's, not by converting a float to an integer, which
// a NaN input would make undefined; a NaN gives NaN.
GROUPLIN_GATE_INLINE float exp_clamped(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kRound = 12582912.0f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float t = x * kLog2e + kRound;
  const float n = t - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t n_bits = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound);
  const uint32_t scale = (n_bits + 127u) << 23;
  return p * std::bit_cast<float>(scale);
}

GROUPLIN_GATE_INLINE void sigmoid(const Chunk x, Chunk y) {
  for (int i = 0; i < kChunk; ++i) y[i] = 1.0f / (1.0f + exp_clamped(-x[i]));
}

// y = act(x) over one chunk.
GROUPLIN_GATE_INLINE void activate(ExpertActivation act, const Chunk x, Chunk y) {
  switch (act) {
    case ExpertActivation::SiLU:
      for (int i = 0; i < kChunk; ++i) y[i] = x[i] / (1.0f + exp_clamped(-x[i]));
      return;
    case ExpertActivation::GELU:
      for (int i = 0; i < kChunk; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kSqrtHalf));
      return;
    case ExpertActivation::GELUTanh:
      for (int i = 0; i < kChunk; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kTanhCubic * v * v * v)));
      }
      return;
    case ExpertActivation::ReLU:
      for (int i = 0; i < kChunk; ++i) y[i] = std::max(x[i], 0.0f);
      return;
    case ExpertActivation::ReLU2:
      for (int i = 0; i < kChunk; ++i) {
        const float relu = std::max(x[i], 0.0f);  // NaN stays NaN, as PyTorch's relu keeps it
        y[i] = relu * relu;
      }
      return;
  }
  for (int i = 0; i < kChunk; ++i) y[i] = x[i];  // not an ExpertActivation: none
}

// y = act'(x) over one chunk.
GROUPLIN_GATE_INLINE void activate_slope(ExpertActivation act, const Chunk x, Chunk y) {
  switch (act) {
    case ExpertActivation::SiLU:
      for (int i = 0; i < kChunk; ++i) {
        const float s = 1.0f / (1.0f + exp_clamped(-x[i]));
        y[i] = s * (1.0f + x[i] * (1.0f - s));
      }
      return;
    case ExpertActivation::GELU:
      for (int i = 0; i < kChunk; ++i) {
        constexpr float kInvSqrt2Pi = 0.39894228040143268f;
        const float v = x[i];
        y[i] = 0.5f * (1.0f + std::erf(v * kSqrtHalf)) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v);
      }
      return;
    case ExpertActivation::GELUTanh:
      for (int i = 0; i < kChunk; ++i) {
        const float v = x[i];
        const float t = std::tanh(kSqrt2OverPi * (v + kTanhCubic * v * v * v));
        const float du = kSqrt2OverPi * (1.0f + 3.0f * kTanhCubic * v * v);
        y[i] = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
      }
      return;
    case ExpertActivation::ReLU:
      for (int i = 0; i < kChunk; ++i) y[i] = x[i] > 0.0f ? 1.0f : 0.0f;
      return;
    case ExpertActivation::ReLU2:
      for (int i = 0; i < kChunk; ++i) y[i] = x[i] > 0.0f ? 2.0f * x[i] : 0.0f;
      return;
  }
  for (int i = 0; i < kChunk; ++i) y[i] = 1.0f;
}

GROUPLIN_GATE_INLINE float round_as(float, float v) { return v; }
GROUPLIN_GATE_INLINE float round_as(uint16_t, float v) { return bf16_to_f32(f32_to_bf16(v)); }

// One chunk of a = gate(gate, up). BF16 activations (T = uint16_t) are rounded after each step
// where a BF16 PyTorch tensor would be (expert_block.hpp).
template <class T>
GROUPLIN_GATE_INLINE void gate_values(const ExpertGate& g, const Chunk gate, const Chunk up,
                                      Chunk a) {
  const auto r = [](float v) { return round_as(T{}, v); };
  const float lim = g.limit;
  Chunk in, act;
  switch (g.kind) {
    case ExpertGateKind::None:
      activate(g.activation, gate, act);
      for (int i = 0; i < kChunk; ++i) a[i] = r(act[i]);
      return;
    case ExpertGateKind::Multiply:
      activate(g.activation, gate, act);
      for (int i = 0; i < kChunk; ++i) a[i] = r(r(act[i]) * up[i]);
      return;
    case ExpertGateKind::ClampBefore:
      for (int i = 0; i < kChunk; ++i) in[i] = r(std::min(gate[i], lim));
      activate(g.activation, in, act);
      for (int i = 0; i < kChunk; ++i) a[i] = r(r(act[i]) * r(std::clamp(up[i], -lim, lim)));
      return;
    case ExpertGateKind::ClampAfter:
      activate(g.activation, gate, act);
      for (int i = 0; i < kChunk; ++i) {
        a[i] = r(r(std::min(r(act[i]), lim)) * r(std::clamp(up[i], -lim, lim)));
      }
      return;
    case ExpertGateKind::GluPlusOne:
      for (int i = 0; i < kChunk; ++i) in[i] = r(r(std::min(gate[i], lim)) * g.alpha);
      sigmoid(in, act);
      for (int i = 0; i < kChunk; ++i) {
        const float gc = r(std::min(gate[i], lim)), uc = r(std::clamp(up[i], -lim, lim));
        a[i] = r(r(uc + 1.0f) * r(gc * r(act[i])));
      }
      return;
  }
  for (int i = 0; i < kChunk; ++i) a[i] = 0.0f;  // not an ExpertGateKind
}

// One chunk of ∂a/∂gate and ∂a/∂up (in F32; a clamp passes the gradient where the bound holds
// with equality too, as PyTorch's clamp does).
GROUPLIN_GATE_INLINE void gate_slopes(const ExpertGate& g, const Chunk gate, const Chunk up,
                                      Chunk d_gate, Chunk d_up) {
  const float lim = g.limit;
  Chunk in, act, slope;
  const auto clamped_up = [&](int i) { return std::clamp(up[i], -lim, lim); };
  const auto up_in = [&](int i) { return up[i] >= -lim && up[i] <= lim; };
  switch (g.kind) {
    case ExpertGateKind::None:
      activate_slope(g.activation, gate, d_gate);
      for (int i = 0; i < kChunk; ++i) d_up[i] = 0.0f;
      return;
    case ExpertGateKind::Multiply:
      activate(g.activation, gate, act);
      activate_slope(g.activation, gate, slope);
      for (int i = 0; i < kChunk; ++i) {
        d_gate[i] = up[i] * slope[i];
        d_up[i] = act[i];
      }
      return;
    case ExpertGateKind::ClampBefore:
      for (int i = 0; i < kChunk; ++i) in[i] = std::min(gate[i], lim);
      activate(g.activation, in, act);
      activate_slope(g.activation, in, slope);
      for (int i = 0; i < kChunk; ++i) {
        d_gate[i] = gate[i] <= lim ? clamped_up(i) * slope[i] : 0.0f;
        d_up[i] = up_in(i) ? act[i] : 0.0f;
      }
      return;
    case ExpertGateKind::ClampAfter:
      activate(g.activation, gate, act);
      activate_slope(g.activation, gate, slope);
      for (int i = 0; i < kChunk; ++i) {
        d_gate[i] = act[i] <= lim ? clamped_up(i) * slope[i] : 0.0f;
        d_up[i] = up_in(i) ? std::min(act[i], lim) : 0.0f;
      }
      return;
    case ExpertGateKind::GluPlusOne:
      for (int i = 0; i < kChunk; ++i) in[i] = g.alpha * std::min(gate[i], lim);
      sigmoid(in, act);
      for (int i = 0; i < kChunk; ++i) {
        const float gc = std::min(gate[i], lim), s = act[i];
        const float glu_slope = s + gc * g.alpha * s * (1.0f - s);
        d_gate[i] = gate[i] <= lim ? (clamped_up(i) + 1.0f) * glu_slope : 0.0f;
        d_up[i] = up_in(i) ? gc * s : 0.0f;
      }
      return;
  }
  for (int i = 0; i < kChunk; ++i) d_gate[i] = d_up[i] = 0.0f;
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

// n values `stride` apart from p, widened to F32 (the rest of the chunk zero: its results are
// never stored). Whole chunks take loops of a fixed count and stride, which vectorize (element by
// element, the chunk's vector loads would wait on its scalar stores).
template <class T>
GROUPLIN_GATE_INLINE void load_strided(const T* p, int64_t stride, int n, Chunk v) {
  if (n == kChunk && stride == 1) {
    for (int i = 0; i < kChunk; ++i) v[i] = load(p, i);
  } else if (n == kChunk && stride == 2) {
    for (int i = 0; i < kChunk; ++i) v[i] = load(p, 2 * i);
  } else {
    for (int i = 0; i < kChunk; ++i) v[i] = i < n ? load(p, i * stride) : 0.0f;
  }
}

// Columns [j0, j0 + n) of a row's gate and up values.
template <class T>
GROUPLIN_GATE_INLINE void load_chunk(const ExpertGate& g, const Columns& c, const T* row,
                                     int64_t j0, int n, Chunk gate, Chunk up) {
  load_strided(row + j0 * c.gate_stride, c.gate_stride, n, gate);
  if (g.kind == ExpertGateKind::None) {
    for (int i = 0; i < kChunk; ++i) up[i] = 0.0f;
  } else {
    load_strided(row + c.up_offset + j0 * c.up_stride, c.up_stride, n, up);
  }
}

// Stores the first n values of v at p, `stride` apart.
template <class T>
GROUPLIN_GATE_INLINE void store_strided(const Chunk v, int n, int64_t stride, T* p) {
  if (n == kChunk && stride == 1) {
    for (int i = 0; i < kChunk; ++i) store(p, i, v[i]);
  } else if (n == kChunk && stride == 2) {
    for (int i = 0; i < kChunk; ++i) store(p, 2 * i, v[i]);
  } else {
    for (int i = 0; i < n; ++i) store(p, i * stride, v[i]);
  }
}

// One row: a [width] = gate(h row), and dh row = da row · ∂a/∂h.
template <class T>
GROUPLIN_GATE_INLINE void forward_row(const ExpertGate& g, const Columns& c, const T* row, T* out,
                                      int64_t width) {
  for (int64_t j0 = 0; j0 < width; j0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, width - j0));
    Chunk gate, up, values;
    load_chunk(g, c, row, j0, n, gate, up);
    gate_values<T>(g, gate, up, values);
    store_strided(values, n, 1, out + j0);
  }
}

template <class T>
GROUPLIN_GATE_INLINE void backward_row(const ExpertGate& g, const Columns& c, const T* row,
                                       const T* grad, T* out, int64_t width) {
  for (int64_t j0 = 0; j0 < width; j0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, width - j0));
    Chunk gate, up, d, d_gate, d_up;
    load_chunk(g, c, row, j0, n, gate, up);
    gate_slopes(g, gate, up, d_gate, d_up);
    load_strided(grad + j0, 1, n, d);
    for (int i = 0; i < kChunk; ++i) {
      d_gate[i] *= d[i];
      d_up[i] *= d[i];
    }
    store_strided(d_gate, n, c.gate_stride, out + j0 * c.gate_stride);
    if (g.kind != ExpertGateKind::None) {
      store_strided(d_up, n, c.up_stride, out + c.up_offset + j0 * c.up_stride);
    }
  }
}

// The rows, one overload per dtype, each compiled for AVX-512F, AVX2 and the baseline and chosen
// by the CPU when the library loads: the wide copies are where the vector loops pay (same
// section). The copies may round differently (FMA contraction); each rounds alike every time.
GROUPLIN_GATE_CLONES void forward_row_of(const ExpertGate& g, const Columns& c, const float* row,
                                         float* out, int64_t width) {
  forward_row(g, c, row, out, width);
}
GROUPLIN_GATE_CLONES void forward_row_of(const ExpertGate& g, const Columns& c, const uint16_t* row,
                                         uint16_t* out, int64_t width) {
  forward_row(g, c, row, out, width);
}
GROUPLIN_GATE_CLONES void backward_row_of(const ExpertGate& g, const Columns& c, const float* row,
                                          const float* grad, float* out, int64_t width) {
  backward_row(g, c, row, grad, out, width);
}
GROUPLIN_GATE_CLONES void backward_row_of(const ExpertGate& g, const Columns& c,
                                          const uint16_t* row, const uint16_t* grad, uint16_t* out,
                                          int64_t width) {
  backward_row(g, c, row, grad, out, width);
}

constexpr int64_t kRowBlock = 32;

template <class T>
void forward_rows(const ExpertGate& g, const Tensor& h, Tensor& a) {
  const int64_t width = a.dim(1), in = h.dim(1);
  const Columns c = columns(g, width);
  const T* hp = h.data_as<T>();
  T* ap = a.mutable_data_as<T>();
  for_each_in_blocks(h.dim(0), kRowBlock,
                     [&](int64_t r) { forward_row_of(g, c, hp + r * in, ap + r * width, width); });
}

template <class T>
void backward_rows(const ExpertGate& g, const Tensor& h, const Tensor& da, Tensor& dh) {
  const int64_t width = da.dim(1), in = h.dim(1);
  const Columns c = columns(g, width);
  const T* hp = h.data_as<T>();
  const T* dap = da.data_as<T>();
  T* dhp = dh.mutable_data_as<T>();
  for_each_in_blocks(h.dim(0), kRowBlock, [&](int64_t r) {
    backward_row_of(g, c, hp + r * in, dap + r * width, dhp + r * in, width);
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
