// Runtime control from the public headers alone: the worker count, forward/backward into the
// caller's tensors (no tensor allocated in a training loop), and tensors over the caller's own
// memory (Tensor::from_blob).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/storage_stats.hpp"
#include "grouplin/grouplin.hpp"
#include "grouplin/runtime.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::gl_options;
using testing::make_gl;

constexpr int64_t kN = 4, kIn = 8, kOut = 6;

class RuntimeControl : public ::testing::Test {
 protected:
  void SetUp() override { saved_threads_ = num_threads(); }
  void TearDown() override { set_num_threads(saved_threads_); }
  int saved_threads_ = 1;
};

TEST_F(RuntimeControl, WorkerCountIsPublicAndNeverChangesBits) {
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  for (int bad : {0, -1, 257}) {
    const Error e = testing::expect_error([&] { set_num_threads(bad); });
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
  }
  EXPECT_EQ(num_threads(), 3);  // a refused call changes nothing

  std::vector<testing::Pass> passes;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    auto gl = make_gl(gl_options(kN, WeightLayout::Single, 7, true, DType::F32, 96, 80));
    passes.push_back(testing::run_pass(*gl));
  }
  testing::expect_same_pass(passes[0], passes[1]);
}

// On an OpenMP runtime's threads (GCC's libgomp, loaded as PyTorch loads its copy), the grouped
// GEMMs give the bits of GroupLin's own threads; a library that is no loaded runtime is refused.
TEST_F(RuntimeControl, OpenMpThreadsGiveTheSameBits) {
  if (dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL) == nullptr) {
    GTEST_SKIP() << "libgomp.so.1 not found: " << dlerror();
  }
  const Error e = testing::expect_error([] { use_openmp_threads("libgrouplin-none.so"); });
  EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
  EXPECT_EQ(openmp_threads(), "");
  set_num_threads(2);
  const std::vector<int64_t> splits = {64, 0, 100, 36};
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor x = testing::test_tensor({200, 256}, 1, dt);
    const Tensor dy = testing::test_tensor({200, 192}, 2, dt);
    const ExpertWeights w = ExpertWeights::stacked(testing::test_tensor({4, 192, 256}, 3, dt));
    std::vector<Tensor> results[2];
    for (int on_openmp : {0, 1}) {
      if (on_openmp) use_openmp_threads("libgomp.so.1");
      results[on_openmp].push_back(grouped_linear_forward(x, splits, w));
      GroupedGrads g = grouped_linear_backward(x, dy, splits, w);
      results[on_openmp].push_back(g.dx);
      results[on_openmp].push_back(g.dw);
      use_own_threads();
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(results[0][i].bit_equal(results[1][i])) << dtype_name(dt) << " result " << i;
    }
  }
  EXPECT_EQ(openmp_threads(), "");
}

TEST_F(RuntimeControl, ForwardAndBackwardIntoCallerTensorsGiveTheSameBits) {
  for (WeightLayout l : testing::kLayouts) {
    SCOPED_TRACE(std::string(layout_name(l)));
    auto a = make_gl(gl_options(kN, l, 3, true, DType::F32, kIn, kOut));
    auto b = make_gl(gl_options(kN, l, 3, true, DType::F32, kIn, kOut));
    const std::vector<int64_t> splits = {2, 0, 3, 1};
    const Tensor x = testing::test_tensor({6, kIn}, 1);
    const Tensor dy = testing::test_tensor({6, kOut}, 2);
    const Tensor y_a = a->forward(x, splits);
    const Tensor dx_a = a->backward(dy);
    Tensor y_b = Tensor::zeros({6, kOut}, DType::F32);
    Tensor dx_b = Tensor::zeros({6, kIn}, DType::F32);
    b->forward(x, splits, y_b);
    b->backward(dy, dx_b);
    EXPECT_TRUE(y_a.bit_equal(y_b));
    EXPECT_TRUE(dx_a.bit_equal(dx_b));
    for (int64_t i = 0; i < kN; ++i) {
      EXPECT_TRUE(a->expert_weight_grad(i).bit_equal(b->expert_weight_grad(i))) << i;
      EXPECT_TRUE(a->expert_bias_grad(i).bit_equal(b->expert_bias_grad(i))) << i;
    }
  }
}

TEST_F(RuntimeControl, ATrainingLoopAllocatesNoTensorAfterItsFirstStep) {
  for (WeightLayout l : testing::kLayouts) {
    SCOPED_TRACE(std::string(layout_name(l)));
    auto gl = make_gl(gl_options(kN, l, 3, true, DType::F32, kIn, kOut));
    const std::vector<int64_t> splits = {2, 0, 3, 1};
    const Tensor x = testing::test_tensor({6, kIn}, 1);
    const Tensor dy = testing::test_tensor({6, kOut}, 2);
    Tensor y = Tensor::zeros({6, kOut}, DType::F32);
    Tensor dx = Tensor::zeros({6, kIn}, DType::F32);
    auto step = [&] {
      gl->forward(x, splits, y);
      gl->backward(dy, dx);
      sgd_step(*gl, 0.01f);
    };
    step();  // allocates the gradients once
    const uint64_t before = detail::storage_stats().allocations;
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(detail::storage_stats().allocations, before);
  }
}

TEST_F(RuntimeControl, BadOutputTensorsAreRefusedAndChangeNothing) {
  auto gl = make_gl(gl_options(kN, WeightLayout::PerExpert, 3, true, DType::F32, kIn, kOut));
  const std::vector<int64_t> splits = {2, 0, 3, 1};
  Tensor x = testing::test_tensor({6, kIn}, 1);
  struct Bad {
    Tensor y;
    ErrorCode code;
    const char* text;
  };
  const std::vector<float> constant(36, 0.0f);
  Tensor both = Tensor::zeros({6, kIn + kOut}, DType::F32);
  Tensor x_in_both = both.reshape({6 * (kIn + kOut)}).rows(0, 6 * kIn).reshape({6, kIn});
  x_in_both.copy_from(x);
  const std::vector<Bad> bad = {
      {Tensor(), ErrorCode::ShapeMismatch, "forward: y has shape <undefined>"},
      {Tensor::zeros({6, kOut + 1}, DType::F32), ErrorCode::ShapeMismatch, "expected [6, 6]"},
      {Tensor::zeros({6, kOut}, DType::BF16), ErrorCode::DTypeMismatch, "is BF16, expected F32"},
      {Tensor::from_blob(constant.data(), {6, kOut}, DType::F32), ErrorCode::ReadOnlyTensor,
       "read-only"},
      {Tensor::zeros({6, kOut}, DType::F32).read_only(), ErrorCode::ReadOnlyTensor, "read-only"},
      {both.reshape({6 * (kIn + kOut)}).rows(0, 6 * kOut).reshape({6, kOut}),
       ErrorCode::InvalidArgument, "shares bytes with an input"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.text);
    Tensor y = b.y;
    const Error e = testing::expect_error([&] { gl->forward(x_in_both, splits, y); });
    EXPECT_EQ(e.code(), b.code) << e.what();
    EXPECT_NE(e.message().find(b.text), std::string::npos) << e.what();
    // Nothing was saved for backward.
    EXPECT_EQ(testing::expect_error([&] {
                gl->backward(Tensor::zeros({6, kOut}, DType::F32));
              }).code(),
              ErrorCode::BackwardBeforeForward);
  }
  Tensor y = Tensor::zeros({6, kOut}, DType::F32);
  gl->forward(x, splits, y);
  Tensor dx = Tensor::zeros({6, kIn + 1}, DType::F32);
  EXPECT_EQ(testing::expect_error([&] { gl->backward(y, dx); }).code(), ErrorCode::ShapeMismatch);
  EXPECT_FALSE(gl->expert_weight_grad(0).defined());  // a refused backward wrote no gradient
}

// The caller's buffers, used in place: x read from a std::vector, y written into another.
TEST_F(RuntimeControl, FromBlobWrapsTheCallersMemoryWithoutACopy) {
  auto gl = make_gl(gl_options(kN, WeightLayout::Contiguous, 3, true, DType::F32, kIn, kOut));
  const std::vector<int64_t> splits = {2, 0, 3, 1};
  const Tensor x_own = testing::test_tensor({6, kIn}, 1);
  std::vector<float> x_buf(6 * kIn), y_buf(6 * kOut, -1.0f);
  std::memcpy(x_buf.data(), x_own.data(), x_own.nbytes());
  const uint64_t copied = detail::storage_stats().copied_bytes;
  const Tensor x = Tensor::from_blob(static_cast<const void*>(x_buf.data()), {6, kIn}, DType::F32);
  Tensor y = Tensor::from_blob(y_buf.data(), {6, kOut}, DType::F32);
  EXPECT_FALSE(x.writable());
  EXPECT_TRUE(y.writable());
  EXPECT_EQ(y.data(), reinterpret_cast<const std::byte*>(y_buf.data()));
  EXPECT_EQ(detail::storage_stats().copied_bytes, copied);
  gl->forward(x, splits, y);
  const Tensor want = gl->forward(x_own, splits);
  EXPECT_EQ(std::memcmp(y_buf.data(), want.data(), want.nbytes()), 0);

  // The owner is kept alive with the storage.
  auto owner = std::make_shared<std::vector<float>>(12, 2.0f);
  std::weak_ptr<std::vector<float>> watch = owner;
  Tensor held = Tensor::from_blob(owner->data(), {3, 4}, DType::F32, owner);
  owner.reset();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(held.data_as<float>()[11], 2.0f);
  held = Tensor();
  EXPECT_TRUE(watch.expired());

  // Misaligned or null memory is refused.
  const Error e = testing::expect_error(
      [&] { Tensor::from_blob(reinterpret_cast<char*>(y_buf.data()) + 2, {2}, DType::F32); });
  EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  EXPECT_NE(e.message().find("not aligned to 4 bytes"), std::string::npos) << e.what();
  EXPECT_EQ(testing::expect_error([&] {
              Tensor::from_blob(static_cast<void*>(nullptr), {2}, DType::F32);
            }).code(),
            ErrorCode::InvalidArgument);
  EXPECT_TRUE(Tensor::from_blob(static_cast<void*>(nullptr), {0, 3}, DType::F32)
                  .defined());  // no elements, no data
}

// Regression: a bad GROUPLIN_ISA was read again at every call, each throwing anew (a value set
// right after the first failure then changed the kernels mid-run), and a forward without rows
// reached no kernel and succeeded. The first use now decides, once, and a forward throws before
// writing anything. In a fresh process (the death test re-executes this binary), since the
// decision is made once per process.
TEST(RuntimeEnvironment, ABadIsaIsOneErrorDecidedAtTheFirstUse) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto check = [] {
    bool ok = true;
    auto expect = [&](bool condition, const char* what) {
      if (!condition) std::fprintf(stderr, "failed: %s\n", what);
      ok = ok && condition;
    };
    ::setenv("GROUPLIN_ISA", "bogus", 1);
    std::string first;
    try {
      kernel_isa();
      expect(false, "kernel_isa() accepted GROUPLIN_ISA=bogus");
    } catch (const Error& e) {
      first = e.message();
      expect(e.code() == ErrorCode::InvalidEnvironment, "InvalidEnvironment");
      expect(first ==
                 "environment variable GROUPLIN_ISA=\"bogus\": expected one of portable, "
                 "avx2, avx512, avx512bf16, amx",
             "the message names the variable, the value and the accepted values");
    }
    ::setenv("GROUPLIN_ISA", "avx2", 1);  // not read again: the decision stands
    try {
      kernel_isa();
      expect(false, "kernel_isa() read GROUPLIN_ISA again");
    } catch (const Error& e) {
      expect(e.message() == first, "the same error again");
    }
    auto gl = make_gl(gl_options(kN, WeightLayout::PerExpert, 3, true, DType::F32, kIn, kOut));
    const std::vector<int64_t> none = {0, 0, 0, 0}, splits = {2, 0, 3, 1};
    try {
      gl->forward(Tensor::zeros({0, kIn}, DType::F32), none);
      expect(false, "a forward without rows ran");
    } catch (const Error& e) {
      expect(e.code() == ErrorCode::InvalidEnvironment, "forward without rows: InvalidEnvironment");
    }
    Tensor y = Tensor::zeros({6, kOut}, DType::F32);
    try {
      gl->forward(testing::test_tensor({6, kIn}, 1), splits, y);
      expect(false, "a forward ran");
    } catch (const Error& e) {
      expect(e.code() == ErrorCode::InvalidEnvironment, "forward: InvalidEnvironment");
    }
    expect(y.bit_equal(Tensor::zeros({6, kOut}, DType::F32)), "y untouched");
    try {
      gl->backward(Tensor::zeros({6, kOut}, DType::F32));
      expect(false, "backward after a failed forward ran");
    } catch (const Error& e) {
      expect(e.code() == ErrorCode::BackwardBeforeForward, "nothing was saved for backward");
    }
    std::fflush(stderr);
    std::_Exit(ok ? 0 : 1);
  };
  EXPECT_EXIT(check(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace grouplin
