// Weights packed once for many forwards (kernels/packed_weights.hpp, GroupedLinear's weight
// packing), on the kernel sets that multiply BF16 pairs: AVX512-BF16 and AMX, emulated (any CPU
// with AVX2+FMA) and native (where the CPU has them; skipped otherwise, with the reason printed).
//
// Checked: a forward from packed weights gives the bits of one that packs per tile, for every
// path an expert's row count selects, ragged strips and depths, 1 and 3 threads, and tilings on
// and off the 16-column strips; GroupedLinear packs only where the kernels read packed weights,
// packs again after every change GroupLin sees (an optimizer step, a load, copy_from, a write to
// the bytes a borrowed weight aliases) and after mark_weights_written, and not otherwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "emulated_kernels.hpp"
#include "grouplin/dtype.hpp"
#include "grouplin/grouped_linear.hpp"
#include "grouplin/optimizer.hpp"
#include "kernel_reference.hpp"
#include "kernels/grouped_gemm.hpp"
#include "kernels/isa.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/micro_kernels_x86.hpp"
#include "kernels/packed_weights.hpp"
#include "kernels/packing.hpp"
#include "kernels/thread_pool.hpp"
#include "kernels/tile_compute.hpp"

namespace grouplin::kernel_test {
namespace {

struct PairSet {
  bool amx;
  bool native;
  const char* name;
};
void PrintTo(const PairSet& p, std::ostream* os) { *os << p.name; }

class WeightPackingTest : public ::testing::TestWithParam<PairSet> {
 protected:
  void SetUp() override {
    const kernels::MicroKernels* avx2 = kernels::avx2_kernels();
    if (avx2 == nullptr) GTEST_SKIP() << "skipped: the pair kernels build on AVX2+FMA";
    set_ = *avx2;
    const PairSet p = GetParam();
    if (p.native) {
      const kernels::CpuFeatures f = kernels::detect_cpu();
      if (!f.avx512bf16 || (p.amx && !f.amx_bf16)) {
        GTEST_SKIP() << "skipped: " << p.name << ": this CPU (" << kernels::describe(f)
                     << ") lacks it; the emulated twin ran instead";
      }
      kernels::native::add_avx512(set_);
      kernels::native::add_avx512bf16(set_);
      if (p.amx) kernels::native::add_amx(set_);
    } else {
      kernels::emulated::add_avx512(set_);
      kernels::emulated::add_avx512bf16(set_);
      if (p.amx) kernels::emulated::add_amx(set_);
    }
    kernels::force_kernels(&set_);
    std::printf("running: %s\n", p.name);
  }
  void TearDown() override {
    kernels::force_kernels(nullptr);
    kernels::set_num_threads(saved_threads_);
  }

  kernels::MicroKernels set_{};
  int saved_threads_ = kernels::num_threads();
};

// Every forward path by row count (dot tiles up to 3 rows, pairs beyond; ragged 16-row groups;
// without packed weights, tiles turned up to 48 rows and at 64, not at 100), an out that leaves
// a ragged last strip, and an odd in over two depth blocks and a ragged third.
constexpr int64_t kIn = 561, kOut = 37;
const std::vector<int64_t> kSplits = {0, 1, 3, 4, 5, 17, 40, 64, 100};

TEST_P(WeightPackingTest, PackedWeightsGiveTheBitsOfPackingPerTile) {
  ASSERT_TRUE(kernels::forward_weights_packable(DType::BF16, DType::BF16));
  EXPECT_FALSE(kernels::forward_weights_packable(DType::F32, DType::F32));
  EXPECT_FALSE(kernels::forward_weights_packable(DType::BF16, DType::F32));
  const int64_t t = std::accumulate(kSplits.begin(), kSplits.end(), int64_t{0});
  const Tensor x = random_tensor({t, kIn}, DType::BF16, 1);
  const Tensor stacked =
      random_tensor({static_cast<int64_t>(kSplits.size()), kOut, kIn}, DType::BF16, 2);
  std::vector<Tensor> weights, biases;
  for (size_t e = 0; e < kSplits.size(); ++e) {
    weights.push_back(stacked.select(static_cast<int64_t>(e)));
    biases.push_back(random_tensor({kOut}, DType::BF16, 10 + e));
  }
  const kernels::PackedForwardBlock packed = kernels::PackedForwardBlock::pack(weights);
  Tensor want = Tensor::zeros({t, kOut}, DType::BF16);
  kernels::set_num_threads(1);
  kernels::grouped_forward(x, kSplits, weights, {}, biases, want);
  for (int threads : {1, 3}) {
    kernels::set_num_threads(threads);
    Tensor got = random_tensor({t, kOut}, DType::BF16, 3);
    kernels::grouped_forward(x, kSplits, weights, {}, biases, got, packed.pointers());
    EXPECT_TRUE(got.bit_equal(want)) << threads << " threads";
  }

  // Tile by tile: 12 x 48 tiles start on strips and read the packed weights; 7 x 40 tiles start
  // off them (column 40) and pack their own.
  kernels::ForwardArgs args;
  args.x = {x.data(), DType::BF16, kIn};
  args.in_features = kIn;
  args.expert_rows = kSplits;
  int64_t row = 0;
  std::vector<kernels::ExpertBlock> blocks;
  for (size_t e = 0; e < kSplits.size(); ++e) {
    args.weights.push_back({weights[e].data(), DType::BF16, kIn});
    args.biases.push_back({biases[e].data(), DType::BF16, kOut});
    args.first_row.push_back(row);
    row += kSplits[e];
  }
  for (const std::byte* p : packed.pointers()) {
    args.packed.push_back(reinterpret_cast<const uint32_t*>(p));
  }
  for (kernels::TileShape shape :
       {kernels::TileShape{12, 48, 6, 16}, kernels::TileShape{7, 40, 1, 1}}) {
    blocks.clear();
    for (size_t e = 0; e < kSplits.size(); ++e) {
      blocks.push_back({args.first_row[e], kSplits[e], kOut, kIn, 0, shape});
    }
    Tensor y = random_tensor({t, kOut}, DType::BF16, 4);
    args.y = {y.mutable_data(), DType::BF16, kOut};
    const kernels::TilePlan plan = kernels::plan_tiles(blocks);
    std::vector<float> scratch(kernels::scratch_floats(plan) + 64);
    float* aligned = scratch.data();
    while (reinterpret_cast<uintptr_t>(aligned) % 64 != 0) ++aligned;
    for (const kernels::Tile& tile : plan.tiles)
      kernels::forward_tile(args, tile, nullptr, aligned);
    EXPECT_TRUE(y.bit_equal(want)) << "tiles " << shape.rows << "x" << shape.cols;
  }
}

GroupedLinearOptions options(WeightLayout layout, DType dtype) {
  GroupedLinearOptions o;
  o.num_gemms = static_cast<int64_t>(kSplits.size());
  o.in_features = kIn;
  o.out_features = kOut;
  o.params_dtype = dtype;
  o.weight_layout = layout;
  o.seed = 7;
  return o;
}

// One training step of plain SGD on a module.
void train_step(GroupedLinear& m, const Tensor& x) {
  m.forward(x, kSplits);
  m.backward(random_tensor({x.dim(0), kOut}, x.dtype(), 9));
  sgd_step(m, 0.25f);
}

TEST_P(WeightPackingTest, GroupedLinearRepacksAfterEveryChangeItSees) {
  const int64_t t = std::accumulate(kSplits.begin(), kSplits.end(), int64_t{0});
  const Tensor x = random_tensor({t, kIn}, DType::BF16, 5);
  for (WeightLayout layout :
       {WeightLayout::PerExpert, WeightLayout::Contiguous, WeightLayout::Single}) {
    SCOPED_TRACE(std::string(layout_name(layout)));
    GroupedLinear plain(options(layout, DType::BF16)), packed(options(layout, DType::BF16));
    EXPECT_FALSE(packed.weight_packing());
    packed.set_weight_packing(true);
    EXPECT_TRUE(packed.weight_packing());
    EXPECT_EQ(packed.packed_weight_bytes(), 0u);  // packed at the first forward
    const auto same = [&](const char* after) {
      EXPECT_TRUE(packed.forward(x, kSplits).bit_equal(plain.forward(x, kSplits))) << after;
    };
    same("the first forward");
    EXPECT_GE(packed.packed_weight_bytes(),
              kSplits.size() * kernels::packed_forward_bytes(kOut, kIn));

    train_step(plain, x);
    train_step(packed, x);
    same("an optimizer step");

    const Tensor w1 = random_tensor({kOut, kIn}, DType::BF16, 6);
    plain.expert_weight(5).copy_from(w1);
    packed.expert_weight(5).copy_from(w1);
    same("copy_from into expert 5");

    packed.load_state_dict(GroupedLinear(options(layout, DType::BF16)).state_dict());
    plain.load_state_dict(GroupedLinear(options(layout, DType::BF16)).state_dict());
    same("load_state_dict");

    // A write GroupLin cannot see (through a pointer taken before the forward) is not: the packed
    // copy is reused, not made again per call, until mark_weights_written.
    Tensor w6 = packed.expert_weight(6), p6 = plain.expert_weight(6);
    auto* bytes = w6.mutable_data_as<uint16_t>();
    auto* plain_bytes = p6.mutable_data_as<uint16_t>();
    same("taking pointers");
    for (int64_t k = 0; k < kIn; ++k) bytes[k] = plain_bytes[k] = f32_to_bf16(2.0f);
    EXPECT_FALSE(packed.forward(x, kSplits).bit_equal(plain.forward(x, kSplits)))
        << "a write through an old pointer is seen without mark_weights_written: packing per call?";
    packed.mark_weights_written();
    same("mark_weights_written");

    packed.set_weight_packing(false);
    EXPECT_EQ(packed.packed_weight_bytes(), 0u);
    same("packing off");
  }
}

// Weights borrowed from the caller (load_state_dict with assign) are read-only aliases of the
// caller's storage: a write the caller makes through it is seen.
TEST_P(WeightPackingTest, WritesToBorrowedWeightsAreSeen) {
  const int64_t t = std::accumulate(kSplits.begin(), kSplits.end(), int64_t{0});
  const Tensor x = random_tensor({t, kIn}, DType::BF16, 5);
  GroupedLinear source(options(WeightLayout::Single, DType::BF16));
  StateDict sd = source.state_dict();
  GroupedLinear borrowing(options(WeightLayout::Single, DType::BF16));
  borrowing.load_state_dict(sd, {.assign = true});
  borrowing.set_weight_packing(true);
  EXPECT_TRUE(borrowing.forward(x, kSplits).bit_equal(source.forward(x, kSplits)));
  source.expert_weight(6).zero();  // the caller's bytes, which `borrowing` aliases read-only
  EXPECT_TRUE(borrowing.forward(x, kSplits).bit_equal(source.forward(x, kSplits)));
}

// Where the kernels would not read packed weights (F32 weights, or BF16 on a set without pair
// kernels) nothing is kept.
TEST_P(WeightPackingTest, NothingIsKeptWhereTheKernelsWouldNotReadIt) {
  const int64_t t = std::accumulate(kSplits.begin(), kSplits.end(), int64_t{0});
  GroupedLinear f32(options(WeightLayout::Single, DType::F32));
  f32.set_weight_packing(true);
  f32.forward(random_tensor({t, kIn}, DType::F32, 5), kSplits);
  EXPECT_EQ(f32.packed_weight_bytes(), 0u);

  kernels::force_kernels(kernels::avx2_kernels());
  GroupedLinear bf16(options(WeightLayout::Single, DType::BF16));
  bf16.set_weight_packing(true);
  bf16.forward(random_tensor({t, kIn}, DType::BF16, 5), kSplits);
  EXPECT_EQ(bf16.packed_weight_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Sets, WeightPackingTest,
                         ::testing::Values(PairSet{false, false, "avx512bf16_emulated"},
                                           PairSet{true, false, "amx_emulated"},
                                           PairSet{false, true, "avx512bf16_native"},
                                           PairSet{true, true, "amx_native"}),
                         [](const ::testing::TestParamInfo<PairSet>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace grouplin::kernel_test
