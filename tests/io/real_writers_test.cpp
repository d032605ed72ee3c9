// Files real writers made, read here (tests/io/real_writers/, each beside the script that made it
// and naming the writer's version): what GroupLin's own writer or a hand-built pickle cannot
// show. Reading them needs no Python; tests/peers/ runs the writers and readers themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/convert.hpp"
#include "grouplin/dtype.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/safetensors.hpp"
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

// TransformerEngine's Float8Tensor as each release pickled it, made by that release's own code
// (make_te_float8.py: TE 1.2-1.7, 1.8-1.10, 1.11-1.13, 2.0-2.3, 2.4-2.13, 2.16, 2.17-2.18), read
// as the codes and scales they are, in the dtype that release's numbering names: TE numbered
// float8 e4m3 6 up to 2.3 and 7 from 2.4, and 2.0-2.15 wrote the same form on both sides.
TEST_F(RealWritersFiles, EveryTransformerEngineReleasesFloat8TensorsLoad) {
  for (const std::string v : {"1_2", "1_8", "1_11", "2_0", "2_4", "2_13", "2_16", "2_17", "2_18"}) {
    SCOPED_TRACE("TransformerEngine " + v);
    const std::string in = kDir + "te" + v + "_float8.pt";
    std::vector<Problem> notes;
    const StateDict sd = load_pt(in, {.notes = &notes});
    ASSERT_EQ(sd.keys(), (std::vector<std::string>{"experts.weight0", "experts.weight0_scale_inv",
                                                   "experts.weight1", "experts.weight1_scale_inv",
                                                   "dense.weight"}));
    for (int e = 0; e < 2; ++e) {
      const std::string w = "experts.weight" + std::to_string(e);
      EXPECT_EQ(sd.at(w).dtype(), DType::F8_E4M3);
      EXPECT_EQ(sd.at(w).shape(), (Shape{8, 16}));
      expect_codes(sd.at(w), 128 * e);
      EXPECT_EQ(sd.at(w + "_scale_inv").data_as<float>()[0], e == 0 ? 0.5f : 0.25f);
    }
    EXPECT_EQ(sd.at("dense.weight").dtype(), DType::BF16);
    // 2.4-2.13: code 7 alone cannot tell 2.0-2.3's e5m2 from 2.4's e4m3: read as the later
    // releases' numbering, and said.
    const bool ambiguous = v == "2_4" || v == "2_13";
    ASSERT_EQ(notes.size(), ambiguous ? 1u : 0u);
    if (ambiguous) {
      EXPECT_EQ(notes[0].code, ErrorCode::AmbiguousTeDType);
    }
    ASSERT_EQ(find_grouped_modules(sd).size(), 1u);
    // Dequantized: each code's E4M3 value times its scale.
    ConvertOptions o;
    o.layout = ExpertLayout::PerExpert;
    o.dtype = DType::F32;
    const std::string out = path("te" + v + ".safetensors");
    convert_checkpoint(in, out, o);
    const StateDict values = load_safetensors(out).tensors;
    const Tensor& w1 = values.at("experts.weight1");
    const auto* codes = reinterpret_cast<const uint8_t*>(sd.at("experts.weight1").data());
    for (int64_t k = 0; k < 8 * 16; ++k) {
      const float want = f8e4m3_to_f32(codes[k]) * 0.25f, got = w1.data_as<float>()[k];
      ASSERT_TRUE(std::isnan(want) ? std::isnan(got) : got == want) << k;
    }
  }
}

// MXFP8Tensor as each TransformerEngine release pickled it, made by its own code
// (make_te_mxfp8.py): the legacy route with 6 (2.0), 7 (2.3, 2.4), 8 (2.6) and 9 (2.12)
// arguments, the module-level function (2.16, 2.18); row-wise E4M3 codes and their [1, 32] E8M0
// block scales, TE's padding cut off.
TEST_F(RealWritersFiles, EveryTransformerEngineReleasesMxfp8TensorsLoad) {
  for (const std::string v : {"2_0", "2_3", "2_4", "2_6", "2_12", "2_16", "2_18"}) {
    SCOPED_TRACE("TransformerEngine " + v);
    std::vector<Problem> notes;
    const StateDict sd = load_pt(kDir + "te" + v + "_mxfp8.pt", {.notes = &notes});
    ASSERT_EQ(sd.keys(), (std::vector<std::string>{"experts.weight0", "experts.weight0_scale_inv",
                                                   "dense.weight"}));
    const Tensor& w = sd.at("experts.weight0");
    EXPECT_EQ(w.dtype(), DType::F8_E4M3);
    EXPECT_EQ(w.shape(), (Shape{4, 64}));
    expect_codes(w, 0);
    const Tensor& s = sd.at("experts.weight0_scale_inv");
    EXPECT_EQ(s.dtype(), DType::F8_E8M0);
    ASSERT_EQ(s.shape(), (Shape{4, 2}));
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t c = 0; c < 2; ++c) {
        EXPECT_EQ(std::to_integer<int>(s.data()[r * 2 + c]), 127 + r + c) << r << ", " << c;
      }
    }
    // 2.4's 7-argument form with code 7 alone: 2.3 wrote the same form with the old numbering.
    ASSERT_EQ(notes.size(), v == "2_4" ? 1u : 0u);
    if (v == "2_4") {
      EXPECT_EQ(notes[0].code, ErrorCode::AmbiguousTeDType);
    }
  }
}

// Training checkpoints as torch.save writes them (make_torch_wrappers.py): the state dict inside
// a wrapper is the one dict of tensors, plain values beside tensors are left out; both said.
TEST(RealWriters, TrainingCheckpointsReadTheirStateDict) {
  auto expect_module = [](const StateDict& sd) {
    ASSERT_EQ(sd.size(), 8u);
    EXPECT_EQ(sd.at("experts.weight2").data_as<float>()[5], 205.0f);
    EXPECT_EQ(sd.at("experts.bias3").data_as<float>()[0], 3.0f);
    ASSERT_EQ(find_grouped_modules(sd).size(), 1u);
  };
  for (const char* name : {"torch2_15_training.pt", "torch2_15_lightning.pt"}) {
    SCOPED_TRACE(name);
    std::vector<Problem> notes;
    expect_module(load_pt(kDir + name, {.notes = &notes}));
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0].code, ErrorCode::EntriesSkipped);
    EXPECT_NE(notes[0].message.find("a training checkpoint"), std::string::npos)
        << notes[0].message;
  }
  std::vector<Problem> notes;
  expect_module(load_pt(kDir + "torch2_15_extra_none.pt", {.notes = &notes}));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].code, ErrorCode::EntriesSkipped);
  EXPECT_NE(notes[0].message.find("\"_extra_state\" (None)"), std::string::npos)
      << notes[0].message;
}

// TransformerEngine 0.12-1.13's _extra_state (an io.BytesIO of torch.save'd FP8 metadata) and
// Megatron-LM's model_optim_rng.pt (argparse.Namespace args, numpy RNG state): inert data, parsed
// and left out, never built; a checkpoint of several model chunks reads the one asked for.
TEST_F(RealWritersFiles, TransformerEngineAndMegatronCheckpointsReadTheirWeights) {
  auto expect_module = [](const StateDict& sd, float add) {
    ASSERT_EQ(sd.size(), 8u);
    EXPECT_EQ(sd.at("experts.weight2").data_as<float>()[5], 205.0f + add);
    EXPECT_EQ(sd.at("experts.bias3").data_as<float>()[0], 3.0f + add);
  };
  auto has_note = [](const std::vector<Problem>& notes, const std::string& text) {
    for (const Problem& p : notes) {
      if (p.code == ErrorCode::EntriesSkipped && p.message.find(text) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  std::vector<Problem> notes;
  expect_module(load_pt(kDir + "torch2_15_extra_bytesio.pt", {.notes = &notes}), 0);
  EXPECT_TRUE(has_note(notes, "\"experts._extra_state\" (_io.BytesIO)"));

  notes.clear();
  expect_module(load_pt(kDir + "torch2_15_megatron.pt", {.notes = &notes}), 0);
  EXPECT_TRUE(has_note(notes, "the dict under \"model\" (its only dict of tensors)"));
  EXPECT_TRUE(has_note(notes, "\"args\", \"checkpoint_version\""));

  const std::string vp = kDir + "torch2_15_megatron_vp.pt";
  Error several = Error(ErrorCode::InvalidArgument, "");
  try {
    load_pt(vp);
    ADD_FAILURE() << "two model chunks read without a key";
  } catch (const Error& e) {
    several = e;
  }
  EXPECT_EQ(several.code(), ErrorCode::SeveralStateDicts);
  EXPECT_NE(std::string(several.what()).find("(\"model0\", \"model1\")"), std::string::npos)
      << several.what();
  notes.clear();
  expect_module(load_pt(vp, {.notes = &notes, .state_dict_key = "model1"}), 1000);
  EXPECT_TRUE(has_note(notes, "the dict under \"model1\" (asked for)"));
  expect_module(load_pt(vp, {.state_dict_key = "model0"}), 0);
  try {
    load_pt(vp, {.state_dict_key = "model7"});
    ADD_FAILURE() << "a key the file does not have";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::MissingKey);
    EXPECT_NE(std::string(e.what()).find("\"model7\""), std::string::npos) << e.what();
  }
  try {  // a key of something that is not a dict of tensors
    load_pt(kDir + "torch2_15_megatron.pt", {.state_dict_key = "args"});
    ADD_FAILURE() << "args read as a state dict";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::MissingKey);
  }

  // The same through convert: the chunk asked for, converted.
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  o.state_dict_key = "model1";
  convert_checkpoint(vp, path("out.safetensors"), o);
  const StateDict out = load_safetensors(path("out.safetensors")).tensors;
  EXPECT_EQ(out.at("experts.weight").data_as<float>()[2 * 24 + 5], 1205.0f);
}

// Files that are no checkpoint GroupLin reads are named as what they are: torch.save's legacy
// format as PyTorch 1.13 writes it (make_torch_legacy.py), a safetensors file cut short, and the
// magic numbers of GGUF, NumPy and Git LFS pointers.
TEST_F(RealWritersFiles, FilesThatAreNoCheckpointAreNamed) {
  auto error = [](const std::string& file) {
    try {
      detect_format(file);
    } catch (const Error& e) {
      return e;
    }
    return Error(ErrorCode::InvalidArgument, "read as a checkpoint");
  };
  Error e = error(kDir + "torch1_13_legacy.pt");
  EXPECT_EQ(e.code(), ErrorCode::UnknownFormat);
  EXPECT_NE(std::string(e.what()).find("torch.save's legacy format"), std::string::npos)
      << e.what();
  auto write = [&](const std::string& name, std::string_view bytes) {
    std::ofstream(path(name), std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path(name);
  };
  StateDict sd;
  sd.insert("w", Tensor::zeros({64}, DType::F32));
  save_safetensors(path("whole.safetensors"), sd);
  const std::string bytes = test_files::read_all(path("whole.safetensors"));
  const size_t header_end =
      8 + static_cast<uint8_t>(bytes[0]) + 256u * static_cast<uint8_t>(bytes[1]);
  for (size_t cut : {size_t{8}, size_t{20}, header_end - 1}) {  // in the header: cut short
    e = error(write("cut.safetensors", std::string_view(bytes).substr(0, cut)));
    EXPECT_EQ(e.code(), ErrorCode::Truncated) << cut << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("cut short"), std::string::npos) << e.what();
  }
  const std::pair<std::string_view, const char*> known[] = {
      {std::string_view("GGUF\x03\0\0\0", 8), "GGUF"},
      {"\x93NUMPY\x01\0v\0{'descr': '<f4'", "NumPy .npy"},
      {"version https://git-lfs.github.com/spec/v1\n", "Git LFS pointer"}};
  for (const auto& [magic, name] : known) {
    e = error(write("known", magic));
    EXPECT_EQ(e.code(), ErrorCode::UnknownFormat);
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace grouplin
