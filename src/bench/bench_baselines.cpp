#include "bench/bench_baselines.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "grouplin/error.hpp"
#include "kernels/thread_pool.hpp"

#if GROUPLIN_HAVE_OPENBLAS
#include <cblas.h>
extern "C" {
// Declared by OpenBLAS's cblas.h in most versions; repeated so older headers work too.
void openblas_set_num_threads(int num_threads);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}
#else
// Built without OpenBLAS (optional: the Python package's build may lack it). bench then runs no
// dense or loop baseline (blas_available()), so this stand-in is never reached.
enum CBLAS_ORDER { CblasRowMajor = 101 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };
template <class... Args>
void cblas_sgemm(Args...) {
  throw grouplin::Error(grouplin::ErrorCode::InvalidArgument,
                        "bench: this grouplin was built without OpenBLAS (no sgemm baseline)");
}
#endif

namespace grouplin::bench {
namespace {

int blas_int(int64_t v) { return static_cast<int>(v); }

const float* f32_values(const Tensor& t, std::vector<float>& scratch) {
  if (t.dtype() == DType::F32) return t.data_as<float>();
  scratch.resize(static_cast<size_t>(t.numel()));
  convert_elements(t.data(), t.dtype(), scratch.data(), DType::F32, scratch.size());
  return scratch.data();
}

float* f32_target(Tensor& t, std::vector<float>& scratch) {
  if (t.dtype() == DType::F32) return t.mutable_data_as<float>();
  scratch.assign(static_cast<size_t>(t.numel()), 0.0f);
  return scratch.data();
}

void store_f32(Tensor& t, const std::vector<float>& scratch) {
  if (t.dtype() != DType::F32) {
    convert_elements(scratch.data(), DType::F32, t.mutable_data(), t.dtype(), scratch.size());
  }
}

}  // namespace

void dense_forward(const Tensor& x, const Tensor& w, Tensor& y) {
  const int64_t t = x.dim(0), in = x.dim(1), out = y.dim(1);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(t), blas_int(out), blas_int(in),
              1.0f, x.data_as<float>(), blas_int(in), w.data_as<float>(), blas_int(in), 0.0f,
              y.mutable_data_as<float>(), blas_int(out));
}

void dense_dgrad(const Tensor& dy, const Tensor& w, Tensor& dx) {
  const int64_t t = dy.dim(0), out = dy.dim(1), in = dx.dim(1);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(t), blas_int(in), blas_int(out),
              1.0f, dy.data_as<float>(), blas_int(out), w.data_as<float>(), blas_int(in), 0.0f,
              dx.mutable_data_as<float>(), blas_int(in));
}

void dense_wgrad(const Tensor& x, const Tensor& dy, Tensor& dw) {
  const int64_t t = x.dim(0), in = x.dim(1), out = dy.dim(1);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(out), blas_int(in), blas_int(t),
              1.0f, dy.data_as<float>(), blas_int(out), x.data_as<float>(), blas_int(in), 0.0f,
              dw.mutable_data_as<float>(), blas_int(in));
}

void loop_forward(const Tensor& x, std::span<const int64_t> m_splits,
                  std::span<const Tensor> weights, std::span<const Tensor> biases, Tensor& y) {
  const int64_t in = x.dim(1), out = y.dim(1);
  std::vector<float> xs, ws, bs, ys;
  int64_t row = 0;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    const int64_t m = m_splits[e];
    if (m == 0) continue;
    Tensor x_e = x.rows(row, m);
    Tensor y_e = y.rows(row, m);
    row += m;
    const float* xp = f32_values(x_e, xs);
    const float* wp = f32_values(weights[e], ws);
    float* yp = f32_target(y_e, ys);
    float beta = 0.0f;
    if (!biases.empty()) {
      const float* bp = f32_values(biases[e], bs);
      for (int64_t r = 0; r < m; ++r) std::copy(bp, bp + out, yp + r * out);
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(m), blas_int(out), blas_int(in),
                1.0f, xp, blas_int(in), wp, blas_int(in), beta, yp, blas_int(out));
    store_f32(y_e, ys);
  }
}

void loop_dgrad(const Tensor& dy, std::span<const int64_t> m_splits,
                std::span<const Tensor> weights, Tensor& dx) {
  const int64_t out = dy.dim(1), in = dx.dim(1);
  std::vector<float> dys, ws, dxs;
  int64_t row = 0;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    const int64_t m = m_splits[e];
    if (m == 0) continue;
    Tensor dy_e = dy.rows(row, m);
    Tensor dx_e = dx.rows(row, m);
    row += m;
    const float* dyp = f32_values(dy_e, dys);
    const float* wp = f32_values(weights[e], ws);
    float* dxp = f32_target(dx_e, dxs);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(m), blas_int(in), blas_int(out),
                1.0f, dyp, blas_int(out), wp, blas_int(in), 0.0f, dxp, blas_int(in));
    store_f32(dx_e, dxs);
  }
}

void loop_wgrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> m_splits,
                std::span<Tensor> wgrads) {
  const int64_t in = x.dim(1), out = dy.dim(1);
  std::vector<float> xs, dys, gs;
  int64_t row = 0;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    const int64_t m = m_splits[e];
    Tensor& g = wgrads[e];
    if (m == 0) {
      g.zero();
      continue;
    }
    Tensor x_e = x.rows(row, m);
    Tensor dy_e = dy.rows(row, m);
    row += m;
    const float* xp = f32_values(x_e, xs);
    const float* dyp = f32_values(dy_e, dys);
    float* gp = f32_target(g, gs);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(out), blas_int(in), blas_int(m),
                1.0f, dyp, blas_int(out), xp, blas_int(in), 0.0f, gp, blas_int(in));
    store_f32(g, gs);
  }
}

void loop_bgrad(const Tensor& dy, std::span<const int64_t> m_splits, std::span<Tensor> bgrads) {
  const int64_t out = dy.dim(1);
  std::vector<float> dys, sums(static_cast<size_t>(out));
  int64_t row = 0;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    const int64_t m = m_splits[e];
    Tensor dy_e = dy.rows(row, m);
    row += m;
    std::fill(sums.begin(), sums.end(), 0.0f);
    if (m > 0) {
      const float* dyp = f32_values(dy_e, dys);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < out; ++c) sums[static_cast<size_t>(c)] += dyp[r * out + c];
      }
    }
    convert_elements(sums.data(), DType::F32, bgrads[e].mutable_data(), bgrads[e].dtype(),
                     sums.size());
  }
}

void parallel_copy(const std::byte* src, std::byte* dst, size_t bytes) {
  const int workers = kernels::workers_for(static_cast<size_t>(kernels::num_threads()));
  const size_t chunk = (bytes / static_cast<size_t>(workers) + 63) / 64 * 64;
  kernels::run_tasks(static_cast<size_t>(workers), workers, [&](size_t task, int) {
    const size_t begin = std::min(bytes, task * chunk);
    const size_t end = std::min(bytes, begin + chunk);
    std::memcpy(dst + begin, src + begin, end - begin);
  });
}

void ensure_short_blas_spin() {
  // Without OpenBLAS there is no spin to shorten, and no reason to start the process again.
  if (!blas_available() || std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr) return;
  std::string cmdline;
  if (FILE* f = std::fopen("/proc/self/cmdline", "rb")) {
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) cmdline.append(buf, n);
    std::fclose(f);
  }
  std::vector<char*> argv;
  for (size_t at = 0; at < cmdline.size(); at = cmdline.find('\0', at) + 1) {
    argv.push_back(cmdline.data() + at);
  }
  argv.push_back(nullptr);
  if (argv.size() < 2) return;
  ::setenv("OPENBLAS_THREAD_TIMEOUT", "22", 1);
  std::fflush(nullptr);
  ::execv("/proc/self/exe", argv.data());  // returns only on failure: carry on as we are
}

void let_blas_threads_sleep() { std::this_thread::sleep_for(std::chrono::milliseconds(3)); }

#if GROUPLIN_HAVE_OPENBLAS
bool blas_available() { return true; }

void set_threads(int n) {
  openblas_set_num_threads(n);
  kernels::set_num_threads(n);
}

const char* blas_description() {
  static const std::string text =
      std::string(openblas_get_config()) + " (core " + openblas_get_corename() + ")";
  return text.c_str();
}
#else
bool blas_available() { return false; }

void set_threads(int n) { kernels::set_num_threads(n); }

const char* blas_description() {
  return "no OpenBLAS: built without it, so no dense or per-expert loop baseline";
}
#endif

}  // namespace grouplin::bench
