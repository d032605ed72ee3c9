// Borrowed bytes are never written (issue: safe borrowed weights). After load_state_dict with
// assign=true the module's parameters view the caller's tensors; every public way to reach them
// (expert views, parameters(), for_each_parameter, state_dict()) refuses writes with
// ReadOnlyTensor, and the accepted ways (writable_value, an optimizer step) write a private copy
// that the module then reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "grouplin/checkpoint.hpp"
#include "grouplin/load_state_dict.hpp"
#include "grouplin/optimizer.hpp"
#include "grouplin/safetensors.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::gl_options;
using testing::make_gl;

constexpr int64_t kN = 4, kIn = 8, kOut = 6;

std::shared_ptr<GroupedLinear> layer(WeightLayout l, uint64_t seed) {
  return make_gl(gl_options(kN, l, seed, true, DType::F32, kIn, kOut));
}

// A caller's dict of its own heap tensors.
StateDict own_copy(const StateDict& sd) {
  StateDict out;
  for (const auto& [name, t] : sd) out.insert(name, t.clone());
  return out;
}

void expect_read_only(Tensor t, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_FALSE(t.writable());
  const Error e = testing::expect_error([&] { t.mutable_data(); });
  EXPECT_EQ(e.code(), ErrorCode::ReadOnlyTensor) << e.what();
  EXPECT_NE(e.message().find("read-only view"), std::string::npos) << e.what();
  EXPECT_EQ(testing::expect_error([&] { t.zero(); }).code(), ErrorCode::ReadOnlyTensor);
  EXPECT_EQ(testing::expect_error([&] { t.copy_from(t.clone()); }).code(),
            ErrorCode::ReadOnlyTensor);
  // Views made from a read-only view refuse writes too.
  if (t.rank() > 0 && t.dim(0) > 0) {
    EXPECT_FALSE(t.select(0).writable());
    EXPECT_FALSE(t.rows(0, 1).writable());
  }
  EXPECT_FALSE(t.reshape({t.numel()}).writable());
  // Nor through the storage it hands out: the storage itself, or a new view made over it.
  ASSERT_TRUE(t.storage() != nullptr);
  EXPECT_FALSE(t.storage()->writable());
  EXPECT_EQ(testing::expect_error([&] { t.storage()->mutable_data(); }).code(),
            ErrorCode::ReadOnlyTensor);
  Tensor over = Tensor::view_of(t.storage(), t.storage_offset(), t.shape(), t.dtype());
  EXPECT_FALSE(over.writable());
  EXPECT_EQ(testing::expect_error([&] { over.mutable_data(); }).code(), ErrorCode::ReadOnlyTensor);
}

// The modules that adopt on assign: PerExpert takes per-expert or stacked sources, Single takes
// stacked ones (Contiguous always copies into its own group).
struct Case {
  WeightLayout source;
  WeightLayout target;
};
constexpr Case kCases[] = {{WeightLayout::PerExpert, WeightLayout::PerExpert},
                           {WeightLayout::Single, WeightLayout::PerExpert},
                           {WeightLayout::Single, WeightLayout::Single}};

// A module that borrowed the caller's own dict (load with assign=true), and that dict's bits.
struct Borrowed {
  std::shared_ptr<GroupedLinear> src;
  StateDict sd;
  testing::Snapshot before;
  std::shared_ptr<GroupedLinear> dst;
};
Borrowed borrow(const Case& c) {
  Borrowed b;
  b.src = layer(c.source, 1);
  b.sd = own_copy(b.src->state_dict());
  b.before = testing::snapshot(b.sd);
  b.dst = layer(c.target, 2);
  b.dst->load_state_dict(b.sd, {.assign = true});
  return b;
}

TEST(BorrowedWeights, EveryPublicPathRefusesWritesToTheCallersBytes) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(layout_name(c.source)) + " -> " + std::string(layout_name(c.target)));
    const auto [src, sd, before, dst] = borrow(c);  // the caller's own, writable tensors

    for (int64_t i = 0; i < kN; ++i) {
      expect_read_only(dst->expert_weight(i), "expert_weight(" + std::to_string(i) + ")");
      expect_read_only(dst->expert_bias(i), "expert_bias(" + std::to_string(i) + ")");
    }
    for (const Parameter& p : dst->parameters()) {
      expect_read_only(p.value, "parameters() " + p.name);
      expect_read_only(dst->parameter(p.name).value, "parameter(\"" + p.name + "\")");
    }
    dst->for_each_parameter([&](const std::string& name, Parameter& p) {
      expect_read_only(p.value, "for_each_parameter " + name);
    });
    for (const auto& [name, t] : dst->state_dict()) {
      if (name != "_extra_state") expect_read_only(t, "state_dict() " + name);
    }
    testing::expect_same(before, sd);  // nothing reached the caller's dict
  }
}

TEST(BorrowedWeights, AnAcceptedWriteIsWhatTheModuleReads) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(layout_name(c.source)) + " -> " + std::string(layout_name(c.target)));
    const auto [src, sd, before, dst] = borrow(c);

    // Through writable_value: a private copy, which becomes the parameter.
    dst->for_each_parameter([&](const std::string&, Parameter& p) {
      Tensor& w = writable_value(p);
      EXPECT_TRUE(w.writable());
      w.mutable_data_as<float>()[0] = 42.0f;
    });
    EXPECT_EQ(dst->expert_weight(0).data_as<float>()[0], 42.0f);
    EXPECT_TRUE(dst->expert_weight(0).writable());
    testing::expect_same(before, sd);

    // And through an expert view, now that the module owns its bytes: forward reads the write.
    Tensor w1 = dst->expert_weight(1);
    w1.zero();
    Tensor b1 = dst->expert_bias(1);
    b1.zero();
    const Tensor x = testing::test_tensor({3, kIn}, 5);
    const std::vector<int64_t> splits = {0, 3, 0, 0};
    const Tensor y = dst->forward(x, splits);
    for (int64_t k = 0; k < y.numel(); ++k) EXPECT_EQ(y.data_as<float>()[k], 0.0f) << k;
    testing::expect_same(before, sd);
  }
}

TEST(BorrowedWeights, TrainingCopiesBeforeItsFirstWrite) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(layout_name(c.source)) + " -> " + std::string(layout_name(c.target)));
    const auto [src, sd, before, dst] = borrow(c);
    testing::run_pass(*dst);
    sgd_step(*dst, 0.5f);
    testing::expect_same(before, sd);
    for (const Parameter& p : dst->parameters()) EXPECT_TRUE(p.value.writable()) << p.name;
    EXPECT_FALSE(dst->expert_weight(0).bit_equal(src->expert_weight(0)));  // it trained
  }
}

// A file mapping is read-only memory: a write through a borrowed view would fault. It is refused
// with the same named error instead.
TEST(BorrowedWeights, MappedFileWeightsRefuseWritesWithoutFaulting) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("grouplin_borrowed_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  save_safetensors(path, layer(WeightLayout::Single, 1)->state_dict());
  {
    const Checkpoint ckpt = load_checkpoint(path);
    auto dst = layer(WeightLayout::Single, 2);
    dst->load_state_dict(ckpt.tensors, {.assign = true});
    expect_read_only(dst->expert_weight(0), "expert_weight(0) of a mapped file");
    sgd_step(*dst, 0.5f);  // no gradients yet: nothing written, nothing copied
    testing::run_pass(*dst);
    sgd_step(*dst, 0.5f);
    EXPECT_TRUE(dst->expert_weight(0).writable());
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace grouplin
