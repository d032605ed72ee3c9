// Files real writers made, read here (tests/io/real_writers/, each beside the script that made it
// and naming the writer's version): what GroupLin's own writer or a hand-built pickle cannot
// show. Reading them needs no Python; tests/peers/ runs the writers and readers themselves.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/pt_file.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

const std::string kDir = std::string(GROUPLIN_SOURCE_DIR) + "/tests/io/real_writers/";

// Byte i of `t` is (first + i) mod 256 (make_torch_float8.py writes every 8-bit code in order).
void expect_codes(const Tensor& t, unsigned first) {
  for (size_t i = 0; i < t.nbytes(); ++i) {
    ASSERT_EQ(std::to_integer<unsigned>(t.data()[i]), (first + i) % 256) << "byte " << i;
  }
}

// torch.save of PyTorch 2.15: float8 storages pickled as torch.storage.UntypedStorage, rebuilt by
// _rebuild_tensor_v3 (make_torch_float8.py).
TEST(RealWriters, PyTorch2Float8FilesLoad) {
  const StateDict sd = load_pt(kDir + "torch2_15_float8.pt");
  ASSERT_EQ(sd.size(), 8u);
  const Tensor& w0 = sd.at("experts.weight0");
  EXPECT_EQ(w0.dtype(), DType::F8_E4M3);
  EXPECT_EQ(w0.shape(), (Shape{8, 16}));
  expect_codes(w0, 0);
  expect_codes(sd.at("experts.weight1"), 128);
  EXPECT_EQ(sd.at("e5m2").dtype(), DType::F8_E5M2);
  EXPECT_EQ(sd.at("e5m2").shape(), (Shape{4, 16}));
  expect_codes(sd.at("e5m2"), 0);
  EXPECT_EQ(sd.at("e8m0").dtype(), DType::F8_E8M0);
  expect_codes(sd.at("e8m0"), 0);
  EXPECT_EQ(sd.at("u16").dtype(), DType::U16);
  EXPECT_EQ(sd.at("u16").data_as<uint16_t>()[5], 5);
  EXPECT_EQ(sd.at("bf16").dtype(), DType::BF16);
  EXPECT_EQ(sd.at("experts.weight1_scale_inv").data_as<float>()[0], 0.25f);
  // The two experts and their scales are one grouped module.
  const std::vector<GroupedModule> modules = find_grouped_modules(sd);
  ASSERT_EQ(modules.size(), 1u);
  EXPECT_EQ(modules[0].num_experts, 2);
  EXPECT_EQ(modules[0].dtype, DType::F8_E4M3);
}

class RealWritersFiles : public test_files::TempDirTest {
 protected:
  RealWritersFiles() : TempDirTest("real_writers") {}
};

// What GroupLin writes of them reads back the same, F8 included (that PyTorch 2.x reads it too is
// tests/peers/test_torch_pt.py's).
TEST_F(RealWritersFiles, PyTorch2Float8FilesRoundTripThroughGroupLinsWriter) {
  const StateDict sd = load_pt(kDir + "torch2_15_float8.pt");
  const std::string out = path("copy.pt");
  save_pt(out, sd);
  const StateDict back = load_pt(out);
  ASSERT_EQ(back.keys(), sd.keys());
  for (const auto& [name, t] : sd) {
    EXPECT_EQ(back.at(name).dtype(), t.dtype()) << name;
    EXPECT_TRUE(back.at(name).bit_equal(t)) << name;
  }
}

}  // namespace
}  // namespace grouplin
