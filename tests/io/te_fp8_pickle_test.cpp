// TransformerEngine's FP8 weights in .pt files (docs/pt-format.md), read without running code,
// from files PyTorch's own torch.save wrote (tests/io/te_fp8_peer.py) and from hand-made pickles:
// Float8Tensor through its reconstructor and through the legacy getattr route, TE's DType in both
// spellings, torch.Size, a tensor that keeps only its transpose; each read field by field, the
// scale beside the codes as key_scale_inv, and dequantized by convert --dtype. Then the variants
// that must be refused: wrong arity, wrong types, a scale of several values, any other getattr,
// an unknown TE dtype code (named with the entry's key).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "grouplin/convert.hpp"
#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/pickle_builder.hpp"
#include "io/pt_archive.hpp"
#include "io/python_peer.hpp"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // TensorSpec defaults (GCC 12)

namespace grouplin {
namespace {

using namespace test_pickle;

constexpr int64_t kOut = 3, kIn = 4;
const std::string kFloat8Module = "transformer_engine.pytorch.tensor.float8_tensor";

// The codes 0x10, 0x11, ... of a [3, 4] weight stored as `rows` x `cols` (the weight, or its
// transpose), and its scale 0.5 in storage "1".
std::string codes(bool transposed) {
  std::string s(kOut * kIn, '\0');
  for (int64_t o = 0; o < kOut; ++o) {
    for (int64_t i = 0; i < kIn; ++i) {
      s[static_cast<size_t>(transposed ? i * kOut + o : o * kIn + i)] =
          static_cast<char>(0x10 + o * kIn + i);
    }
  }
  return s;
}

std::string data_tensor(bool transposed) {
  return tensor(
      {.storage_type = "ByteStorage",
       .key = "0",
       .numel = kOut * kIn,
       .size = transposed ? std::vector<int64_t>{kIn, kOut} : std::vector<int64_t>{kOut, kIn},
       .stride = transposed ? std::vector<int64_t>{kOut, 1} : std::vector<int64_t>{kIn, 1}});
}

std::string scale_tensor(int64_t numel = 1) {
  return tensor(
      {.storage_type = "FloatStorage", .key = "1", .numel = numel, .size = {numel}, .stride = {1}});
}

std::string te_dtype(int64_t code, bool old_spelling = false) {
  return (old_spelling ? G("transformer_engine_torch", "DType")
                       : G("transformer_engine.pytorch.constants", "DType")) +
         "(" + I(code) + "tR";
}

// The reconstructor, or the legacy route to it.
std::string reconstructor(bool legacy) {
  return legacy ? G("__builtin__", "getattr") + "(" + G(kFloat8Module, "Float8Tensor") +
                      U("_make_in_reduce_ex") + "tR"
                : G(kFloat8Module, "_make_float8_tensor_in_reduce_ex");
}

struct Float8Spec {
  bool legacy = false;
  bool old_dtype = false;
  bool transpose_only = false;
  int64_t code = 7;
  std::string args_override;  // replaces the arguments when not empty
};

std::string float8(const Float8Spec& s) {
  std::string args = s.args_override;
  if (args.empty()) {
    const std::string data = s.transpose_only ? "N" : data_tensor(false);
    const std::string transpose = s.transpose_only ? data_tensor(true) : "N";
    // Five arguments as TE 2.x writes them; the sixth (data_transpose) only where TE's main
    // after 2.18 writes it, through the module-level reconstructor.
    args = data + te_dtype(s.code, s.old_dtype) + scale_tensor() + G("torch", "bfloat16") +
           G("torch", "Size") + "(" + T({kOut, kIn}) + "tR" + (s.transpose_only ? transpose : "");
  }
  return reconstructor(s.legacy) + "(" + args + "tR";
}

std::vector<std::byte> pt_file(const std::string& value, bool transposed = false,
                               int64_t scale_numel = 1) {
  std::string scale(static_cast<size_t>(scale_numel) * 4, '\0');
  const float half = 0.5f;
  std::memcpy(scale.data(), &half, 4);
  return test_io::archive({{"archive/data.pkl", state_dict({{"w", value}})},
                           {"archive/byteorder", "little"},
                           {"archive/data/0", codes(transposed)},
                           {"archive/data/1", scale},
                           {"archive/version", "3\n"}});
}

Error parse_error(const std::vector<std::byte>& file) {
  try {
    parse_pt(test_io::to_storage(file), "te.pt");
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::InvalidArgument, "no error");
}

TEST(TeFp8Pickle, Float8TensorsReadAsCodesWithTheirScale) {
  for (const Float8Spec& s :
       {Float8Spec{}, Float8Spec{.legacy = true}, Float8Spec{.old_dtype = true},
        Float8Spec{.transpose_only = true}, Float8Spec{.legacy = true, .code = 8}}) {
    SCOPED_TRACE(std::string(s.legacy ? "legacy " : "") + (s.old_dtype ? "old DType " : "") +
                 (s.transpose_only ? "transpose only " : "") + std::to_string(s.code));
    const StateDict sd =
        parse_pt(test_io::to_storage(pt_file(float8(s), s.transpose_only)), "te.pt");
    ASSERT_EQ(sd.keys(), (std::vector<std::string>{"w", "w_scale_inv"}));
    const Tensor& w = sd.at("w");
    EXPECT_EQ(w.dtype(), s.code == 7 ? DType::F8_E4M3 : DType::F8_E5M2);
    ASSERT_EQ(w.shape(), (Shape{kOut, kIn}));
    const auto* bytes = reinterpret_cast<const uint8_t*>(w.data());
    for (int64_t k = 0; k < kOut * kIn; ++k) EXPECT_EQ(bytes[k], 0x10 + k) << k;
    EXPECT_EQ(sd.at("w_scale_inv").dtype(), DType::F32);
    EXPECT_EQ(sd.at("w_scale_inv").data_as<float>()[0], 0.5f);
  }
}

// The four forms as torch.save pickles them, opcode for opcode.
TEST(TeFp8Pickle, TorchSaveFilesReadFieldByField) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("grouplin_te_peer_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string output;
  ASSERT_EQ(test_io::run_python_peer("tests/io/te_fp8_peer.py", dir.string(), output), 0) << output;
  for (const char* name :
       {"te_float8", "te_float8_legacy", "te_float8_transpose", "te_float8_e5m2"}) {
    SCOPED_TRACE(name);
    const StateDict sd = load_pt((dir / (std::string(name) + ".pt")).string());
    ASSERT_EQ(sd.keys(), (std::vector<std::string>{"w", "w_scale_inv", "b"}));
    const Tensor& w = sd.at("w");
    EXPECT_EQ(w.dtype(), std::string(name) == "te_float8_e5m2" ? DType::F8_E5M2 : DType::F8_E4M3);
    ASSERT_EQ(w.shape(), (Shape{kOut, kIn}));
    for (int64_t k = 0; k < kOut * kIn; ++k) {
      EXPECT_EQ(reinterpret_cast<const uint8_t*>(w.data())[k], 0x10 + k) << k;
    }
    EXPECT_EQ(sd.at("w_scale_inv").data_as<float>()[0], 0.5f);
    EXPECT_EQ(sd.at("b").dtype(), DType::BF16);
  }
  std::filesystem::remove_all(dir);
}

// MXFP8Tensor as torch.save pickles it, its scales row-major (a column-wise copy beside) and
// swizzled for the GEMM: codes as they are, E8M0 scales unpadded and in row-major order, and the
// values PyTorch's rule gives.
TEST(TeFp8Pickle, Mxfp8TensorsReadWithPlainScalesAndDequantize) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("grouplin_te_mx_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string output;
  ASSERT_EQ(test_io::run_python_peer("tests/io/te_fp8_peer.py", dir.string(), output), 0) << output;
  constexpr int64_t kRows = 130, kCols = 70, kScaleCols = 3;
  for (const char* name : {"te_mxfp8", "te_mxfp8_swizzled"}) {
    SCOPED_TRACE(name);
    const std::string in = (dir / (std::string(name) + ".pt")).string();
    std::vector<Problem> notes;
    const StateDict sd = load_pt(in, {.notes = &notes});
    // The plain file keeps a column-wise copy beside the row-wise data: left out, and said.
    if (std::string(name) == "te_mxfp8") {
      ASSERT_EQ(notes.size(), 1u);
      EXPECT_EQ(notes[0].code, ErrorCode::CopyDropped);
      EXPECT_EQ(notes[0].key, "w");
    } else {
      EXPECT_TRUE(notes.empty());
    }
    ASSERT_EQ(sd.keys(), (std::vector<std::string>{"w", "w_scale_inv"}));
    ASSERT_EQ(sd.at("w").shape(), (Shape{kRows, kCols}));
    ASSERT_EQ(sd.at("w_scale_inv").dtype(), DType::F8_E8M0);
    ASSERT_EQ(sd.at("w_scale_inv").shape(), (Shape{kRows, kScaleCols}));
    const auto* codes = reinterpret_cast<const uint8_t*>(sd.at("w").data());
    const auto* scales = reinterpret_cast<const uint8_t*>(sd.at("w_scale_inv").data());
    size_t bad_codes = 0, bad_scales = 0;
    for (int64_t k = 0; k < kRows * kCols; ++k) {
      auto want = static_cast<uint8_t>(k % 256);
      if ((want & 0x7f) == 0x7f) want = 0x3f;
      bad_codes += codes[k] != want;
    }
    for (int64_t k = 0; k < kRows * kScaleCols; ++k) bad_scales += scales[k] != 20 + k % 200;
    EXPECT_EQ(bad_codes, 0u);
    EXPECT_EQ(bad_scales, 0u);

    ConvertOptions o;
    o.dtype = DType::F32;
    const std::string out = (dir / (std::string(name) + ".safetensors")).string();
    convert_checkpoint(in, out, o);
    const StateDict values = load_safetensors(out).tensors;
    ASSERT_EQ(values.keys(), std::vector<std::string>{"w"});
    size_t bad_values = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) {
        const float want =
            f8e4m3_to_f32(codes[r * kCols + c]) * f8e8m0_to_f32(scales[r * kScaleCols + c / 32]);
        bad_values += values.at("w").data_as<float>()[r * kCols + c] != want;
      }
    }
    EXPECT_EQ(bad_values, 0u);
  }
  std::filesystem::remove_all(dir);
}

TEST(TeFp8Pickle, Float8TensorsDequantizeOnConvert) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("grouplin_te_fp8_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::byte> file = pt_file(float8({}));
  std::ofstream((dir / "te.pt").string(), std::ios::binary)
      .write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  ConvertOptions o;
  o.dtype = DType::F32;
  convert_checkpoint((dir / "te.pt").string(), (dir / "out.safetensors").string(), o);
  const StateDict out = load_safetensors((dir / "out.safetensors").string()).tensors;
  ASSERT_EQ(out.keys(), std::vector<std::string>{"w"});
  for (int64_t k = 0; k < kOut * kIn; ++k) {
    EXPECT_EQ(out.at("w").data_as<float>()[k],
              f8e4m3_to_f32(static_cast<uint8_t>(0x10 + k)) * 0.5f);
  }
  std::filesystem::remove_all(dir);
}

TEST(TeFp8Pickle, MalformedOrForeignVariantsAreRefused) {
  const std::string size = G("torch", "Size") + "(" + T({kOut, kIn}) + "tR";
  struct Bad {
    std::string what;
    std::string value;
    int64_t scale_numel;
    ErrorCode code;
    std::string part;
  };
  const Bad cases[] = {
      {"four arguments to the module-level reconstructor",
       float8({.args_override =
                   data_tensor(false) + te_dtype(7) + scale_tensor() + G("torch", "bfloat16")}),
       1, ErrorCode::InvalidPickle, "called with 4 arguments, which no TransformerEngine release"},
      {"six arguments through the legacy route (TE itself fails on it)",
       float8({.legacy = true,
               .args_override = data_tensor(false) + te_dtype(7) + scale_tensor() +
                                G("torch", "bfloat16") + size + "N"}),
       1, ErrorCode::InvalidPickle, "called with 6 arguments, which no TransformerEngine release"},
      {"a pybind11 DType without its code",
       float8({.args_override = data_tensor(false) + G("transformer_engine_torch", "DType") +
                                ")\x81" + scale_tensor() + G("torch", "bfloat16") + size}),
       1, ErrorCode::InvalidPickle, "fp8_dtype is a"},
      {"data an int",
       float8({.args_override =
                   I(3) + te_dtype(7) + scale_tensor() + G("torch", "bfloat16") + size + "N"}),
       1, ErrorCode::InvalidPickle, "data is a int"},
      {"fp8_dtype a plain int",
       float8({.args_override = data_tensor(false) + I(7) + scale_tensor() +
                                G("torch", "bfloat16") + size + "N"}),
       1, ErrorCode::InvalidPickle, "fp8_dtype is a int"},
      {"a scale of 12 values",
       float8({.args_override = data_tensor(false) + te_dtype(7) + scale_tensor(12) +
                                G("torch", "bfloat16") + size + "N"}),
       12, ErrorCode::InvalidPickle, "expected one F32 value"},
      {"shape not the data's",
       float8({.args_override = data_tensor(false) + te_dtype(7) + scale_tensor() +
                                G("torch", "bfloat16") + G("torch", "Size") + "(" + T({kIn, kOut}) +
                                "tR" + "N"}),
       1, ErrorCode::InvalidPickle, "data has shape [3, 4], the tensor [4, 3]"},
      {"no data at all",
       float8({.args_override =
                   "N" + te_dtype(7) + scale_tensor() + G("torch", "bfloat16") + size + "N"}),
       1, ErrorCode::InvalidPickle, "neither data nor data_transpose"},
      {"another getattr",
       G("__builtin__", "getattr") + "(" + G(kFloat8Module, "Float8Tensor") + U("__init__") + "tR" +
           "(" + "tR",
       1, ErrorCode::ForbiddenGlobal, "getattr is accepted only as"},
      {"getattr of another class",
       G("builtins", "getattr") + "(" + G("collections", "OrderedDict") + U("_make_in_reduce_ex") +
           "tR" + "(" + "tR",
       1, ErrorCode::ForbiddenGlobal, "getattr is accepted only as"},
      {"the class called", G(kFloat8Module, "Float8Tensor") + "(tR", 1, ErrorCode::InvalidPickle,
       "is not supported"},
      {"an unknown TE dtype code", float8({.code = 42}), 1, ErrorCode::UnsupportedDType,
       "state dict entry \"w\": a TransformerEngine FP8 tensor of TE dtype code 42"},
      {"a float32 TE dtype code", float8({.code = 4}), 1, ErrorCode::UnsupportedDType,
       "TE dtype code 4; expected 7 (float8 e4m3) or 8 (float8 e5m2)"},
      {"a reconstructor outside the list",
       G("transformer_engine.pytorch.tensor.float8_tensor", "Float8Quantizer") + "(tR", 1,
       ErrorCode::ForbiddenGlobal, "Float8Quantizer"},
      {"an MXFP8 tensor of 7 arguments",
       G("transformer_engine.pytorch.tensor.mxfp8_tensor", "_make_mxfp8_tensor_in_reduce_ex") +
           "(NNNN" + te_dtype(7) + G("torch", "bfloat16") + size + "tR",
       1, ErrorCode::InvalidPickle, "called with 7 arguments, expected 9"},
      {"an MXFP8 tensor without row-wise data",
       G("transformer_engine.pytorch.tensor.mxfp8_tensor", "_make_mxfp8_tensor_in_reduce_ex") +
           "(NN" + data_tensor(false) + "N" + te_dtype(7) + G("torch", "bfloat16") + size + "N" +
           "\x89tR",
       1, ErrorCode::UnsupportedConversion, "only the column-wise copy kept"},
      {"MX scales of the wrong padding (an oversized array)",
       G("transformer_engine.pytorch.tensor.mxfp8_tensor", "_make_mxfp8_tensor_in_reduce_ex") +
           "(" + data_tensor(false) + data_tensor(false) + "NN" + te_dtype(7) +
           G("torch", "bfloat16") + size + "N\x89tR",
       1, ErrorCode::InvalidPickle, "expected the contiguous [128, 4]"},
      {"a quantizer with a tensor field",
       G("transformer_engine.pytorch.tensor.mxfp8_tensor", "MXFP8Quantizer") + ")\x81" + "}" +
           U("scale") + scale_tensor() + "sb",
       1, ErrorCode::InvalidPickle, "MXFP8Quantizer field \"scale\" is a tensor"},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.what);
    const Error e = parse_error(pt_file(b.value, false, b.scale_numel));
    EXPECT_EQ(e.code(), b.code) << e.what();
    EXPECT_NE(std::string(e.what()).find(b.part), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace grouplin
