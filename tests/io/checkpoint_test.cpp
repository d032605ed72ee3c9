// Format detection by content, format choice by extension, and load/save dispatch.
#include "grouplin/checkpoint.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/safetensors.hpp"
#include "sharded_dir.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("grouplin_checkpoint_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    Tensor w = Tensor::zeros({2, 3}, DType::F32);
    for (int i = 0; i < 6; ++i) w.mutable_data_as<float>()[i] = static_cast<float>(i) / 3;
    sd_.insert("fc1.weight0", w);
    sd_.insert("fc1.bias0", Tensor::zeros({2}, DType::BF16));
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_file(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  void expect_same(const StateDict& got) const {
    ASSERT_EQ(got.keys(), sd_.keys());
    for (const auto& [name, t] : sd_) EXPECT_TRUE(t.bit_equal(got.at(name))) << name;
  }

  fs::path dir_;
  StateDict sd_;
};

TEST_F(CheckpointTest, DetectsByContentNotExtension) {
  save_pt(path("really_pt.safetensors"), sd_);
  save_safetensors(path("really_st.pt"), sd_, {});
  EXPECT_EQ(detect_format(path("really_pt.safetensors")), CheckpointFormat::Pt);
  EXPECT_EQ(detect_format(path("really_st.pt")), CheckpointFormat::Safetensors);
  Checkpoint c = load_checkpoint(path("really_pt.safetensors"));
  EXPECT_EQ(c.format, CheckpointFormat::Pt);
  expect_same(c.tensors);
}

TEST_F(CheckpointTest, UnknownFormat) {
  write_file("garbage.pt", "hello world, not a checkpoint");
  write_file("empty.pt", "");
  // A plausible-looking length but no JSON object after it.
  write_file("almost.safetensors", std::string("\x02\x00\x00\x00\x00\x00\x00\x00[]", 10));
  for (const char* name : {"garbage.pt", "empty.pt", "almost.safetensors"}) {
    try {
      detect_format(path(name));
      FAIL() << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::UnknownFormat) << e.what();
      EXPECT_NE(e.message().find(name), std::string::npos) << e.what();
      EXPECT_NE(e.message().find("first bytes"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(load_checkpoint(path("garbage.pt")), Error);
}

TEST_F(CheckpointTest, MissingFile) {
  try {
    detect_format(path("missing.pt"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
  }
}

TEST_F(CheckpointTest, FormatForExtension) {
  EXPECT_EQ(format_for_extension("a/model.safetensors"), CheckpointFormat::Safetensors);
  EXPECT_EQ(format_for_extension("model.pt"), CheckpointFormat::Pt);
  EXPECT_EQ(format_for_extension("model.PTH"), CheckpointFormat::Pt);
  EXPECT_EQ(format_for_extension("pytorch_model.bin"), CheckpointFormat::Pt);
  EXPECT_EQ(format_for_extension("model.ckpt"), std::nullopt);
  EXPECT_EQ(format_for_extension("safetensors"), std::nullopt);
  EXPECT_EQ(format_name(CheckpointFormat::Pt), "pt");
  EXPECT_EQ(format_name(CheckpointFormat::Safetensors), "safetensors");
}

TEST_F(CheckpointTest, SaveChoosesTheFormat) {
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  save_checkpoint(path("a.pt"), sd_, {}, meta);
  save_checkpoint(path("b.safetensors"), sd_, {}, meta);
  save_checkpoint(path("c.ckpt"), sd_, {}, meta);  // unknown extension: the default format
  save_checkpoint(path("d.safetensors"), sd_, CheckpointFormat::Pt);
  EXPECT_EQ(detect_format(path("a.pt")), CheckpointFormat::Pt);
  EXPECT_EQ(detect_format(path("b.safetensors")), CheckpointFormat::Safetensors);
  EXPECT_EQ(detect_format(path("c.ckpt")), CheckpointFormat::Safetensors);
  EXPECT_EQ(detect_format(path("d.safetensors")), CheckpointFormat::Pt);

  Checkpoint a = load_checkpoint(path("a.pt"));
  expect_same(a.tensors);
  EXPECT_TRUE(a.metadata.empty());  // .pt has no place for metadata
  Checkpoint b = load_checkpoint(path("b.safetensors"));
  EXPECT_EQ(b.format, CheckpointFormat::Safetensors);
  expect_same(b.tensors);
  EXPECT_EQ(b.metadata, meta);
}

TEST_F(CheckpointTest, FailedSaveKeepsTheOldFile) {
  save_checkpoint(path("m.pt"), sd_);
  StateDict bad = sd_;
  bad.insert("undefined", Tensor());
  EXPECT_THROW(save_checkpoint(path("m.pt"), bad), Error);
  expect_same(load_checkpoint(path("m.pt")).tensors);
}

// The bytes of the file at `p`.
std::string file_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(CheckpointTest, CopyOnWriteTensorsAreWritableAndNeverChangeTheFile) {
  save_checkpoint(path("m.safetensors"), sd_);
  save_checkpoint(path("m.pt"), sd_);
  testing::write_sharded(dir_ / "dir", sd_, {.shards = 2});
  for (const std::string& p : {path("m.safetensors"), path("m.pt"), path("dir")}) {
    const std::string shard = p == path("dir") ? path("dir/model-00001-of-00002.safetensors") : p;
    const std::string before = file_bytes(shard);
    Checkpoint ro = load_checkpoint(p);
    EXPECT_FALSE(ro.tensors.at("fc1.weight0").writable()) << p;
    Checkpoint c = load_checkpoint(p, MapMode::CopyOnWrite);
    ASSERT_EQ(c.tensors.size(), sd_.size());  // (a directory's in natural key order)
    for (const auto& [name, t] : sd_) EXPECT_TRUE(t.bit_equal(c.tensors.at(name))) << name;
    Tensor w = c.tensors.at("fc1.weight0");
    ASSERT_TRUE(w.writable()) << p;
    w.mutable_data_as<float>()[0] = 42.0f;
    EXPECT_EQ(w.data_as<float>()[0], 42.0f);
    EXPECT_EQ(file_bytes(shard), before) << p;
    EXPECT_TRUE(sd_.at("fc1.weight0").bit_equal(load_checkpoint(p).tensors.at("fc1.weight0")));
  }
}

}  // namespace
}  // namespace grouplin
