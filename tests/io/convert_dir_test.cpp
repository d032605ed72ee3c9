// Converting sharded checkpoint directories: both directions between Hugging Face module lists
// and fused experts, byte-for-byte round trips of GroupLin's own output, the shard limit, the
// index, other files copied, weight files skipped, .bin shards, file <-> directory, and the
// output's atomicity (replaced whole, nothing left on failure, never inside or over the input).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grouplin/grouplin.hpp"
#include "io/moe_checkpoint.hpp"
#include "io/same_dict.hpp"
#include "io/sharded_dir.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using test_files::read_all;
using testing::expect_same_dict;
using testing::hf_state_dict;
using testing::HfSpec;
using testing::write_sharded;
using testing::write_text;

class ConvertDirTest : public test_files::TempDirTest {
 protected:
  ConvertDirTest() : TempDirTest("grouplin_convert_dir") {}
  ConvertReport convert(const std::string& in, const std::string& out, ExpertLayout layout,
                        std::optional<uint64_t> max_shard_size = std::nullopt) {
    ConvertOptions o;
    o.layout = layout;
    o.max_shard_size = max_shard_size;
    return convert_checkpoint(path(in), path(out), o);
  }
};

// Every file of directory `a` has a twin of the same bytes in `b`, and the reverse.
void expect_same_files(const fs::path& a, const fs::path& b) {
  std::map<std::string, std::string> fa, fb;
  for (const auto& e : fs::recursive_directory_iterator(a)) {
    if (e.is_regular_file()) fa[fs::relative(e.path(), a).string()] = read_all(e.path());
  }
  for (const auto& e : fs::recursive_directory_iterator(b)) {
    if (e.is_regular_file()) fb[fs::relative(e.path(), b).string()] = read_all(e.path());
  }
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, bytes] : fa) {
    ASSERT_TRUE(fb.count(name)) << name;
    EXPECT_TRUE(fb[name] == bytes) << name << " differs";
  }
}

// The index of `dir` lists every tensor of its shards, where it is, with the exact total_size.
void expect_exact_index(const fs::path& dir) {
  const ShardIndex index =
      parse_shard_index(read_all(dir / "model.safetensors.index.json"), "index");
  std::map<std::string, std::string> where;
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 12 || name.substr(name.size() - 12) != ".safetensors") continue;
    for (const auto& [key, t] : load_safetensors(e.path().string()).tensors) {
      where[key] = name;
      total += t.nbytes();
    }
  }
  EXPECT_EQ(index.total_size, total);
  ASSERT_EQ(index.weight_map.size(), where.size());
  for (const auto& [key, file] : index.weight_map) EXPECT_EQ(where[key], file) << key;
}

TEST_F(ConvertDirTest, ModuleListsToFusedExpertsAndBackByteForByte) {
  for (const char* family : {"qwen", "mixtral"}) {
    SCOPED_TRACE(family);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const HfSpec spec{.family = family, .experts = 8};
    const bool mixtral = std::string(family) == "mixtral";
    write_sharded(dir_ / "hf", hf_state_dict(spec, false),
                  {.model_type = mixtral ? "mixtral" : "qwen3_moe"});
    // Small shards: the fused tensors and the experts they come from spread over several.
    const ConvertReport r = convert("hf", "fused", ExpertLayout::Single, 2000);
    EXPECT_TRUE(r.directory_output);
    EXPECT_GT(r.output_files.size(), 2u);
    expect_same_dict(load_checkpoint(path("fused")).tensors, hf_state_dict(spec, true));
    expect_exact_index(dir_ / "fused");
    EXPECT_EQ(read_all(dir_ / "fused" / "config.json"), read_all(dir_ / "hf" / "config.json"));
    EXPECT_EQ(read_all(dir_ / "fused" / "tokenizer.json"),
              read_all(dir_ / "hf" / "tokenizer.json"));
    EXPECT_EQ(r.copied_files, (std::vector<std::string>{"config.json", "tokenizer.json"}));

    // Back: config.json's model_type tells a fused Mixtral from a fused Qwen.
    convert("fused", "back", ExpertLayout::PerExpert, 2000);
    expect_same_dict(load_checkpoint(path("back")).tensors, hf_state_dict(spec, false));
    expect_exact_index(dir_ / "back");
    // GroupLin's own output, converted there and back, comes back byte for byte.
    convert("back", "fused2", ExpertLayout::Single, 2000);
    expect_same_files(dir_ / "fused", dir_ / "fused2");
    convert("fused2", "back2", ExpertLayout::PerExpert, 2000);
    expect_same_files(dir_ / "back", dir_ / "back2");
  }
}

// Dequantized, a checkpoint no longer is what its config.json's quantization_config says: that
// entry goes (and the summary says so); everything else of config.json stays. Without FP8 in
// config.json, the file is copied as it is.
TEST_F(ConvertDirTest, DequantizingDropsTheFp8QuantizationConfig) {
  StateDict sd;
  sd.insert("model.layers.0.self_attn.o_proj.weight", Tensor::zeros({128, 128}, DType::F8_E4M3));
  sd.insert("model.layers.0.self_attn.o_proj.weight_scale_inv", Tensor::zeros({1, 1}, DType::F32));
  fs::create_directories(path("fp8"));
  save_safetensors(path("fp8/model.safetensors"), sd);
  write_text(path("fp8/config.json"),
             R"({"hidden_size": 128, "model_type": "deepseek_v3", "quantization_config": )"
             R"({"quant_method": "fp8", "weight_block_size": [128, 128]}})");
  ConvertOptions o;
  o.dtype = DType::BF16;
  const ConvertReport r = convert_checkpoint(path("fp8"), path("bf16"), o);
  ASSERT_EQ(r.edited_files.size(), 1u);
  EXPECT_NE(r.edited_files[0].find("quantization_config"), std::string::npos);
  const nlohmann::json config =
      nlohmann::json::parse(test_files::read_all(path("bf16/config.json")));
  EXPECT_FALSE(config.contains("quantization_config"));
  EXPECT_EQ(config["hidden_size"], 128);
  EXPECT_EQ(config["model_type"], "deepseek_v3");
  EXPECT_EQ(
      load_checkpoint(path("bf16")).tensors.at("model.layers.0.self_attn.o_proj.weight").dtype(),
      DType::BF16);
  // A config.json without FP8: copied byte for byte, nothing edited.
  write_text(path("fp8/config.json"), R"({"model_type": "deepseek_v3"})");
  const ConvertReport plain = convert_checkpoint(path("fp8"), path("bf16b"), o);
  EXPECT_TRUE(plain.edited_files.empty());
  EXPECT_EQ(test_files::read_all(path("bf16b/config.json")), R"({"model_type": "deepseek_v3"})");
}

TEST_F(ConvertDirTest, ShardsStayUnderTheLimitUnlessOneTensorAloneIsOver) {
  const StateDict sd = hf_state_dict({.experts = 8}, false);
  write_sharded(dir_ / "hf", sd);
  for (uint64_t limit : {200u, 500u, 1000u}) {
    SCOPED_TRACE(limit);
    fs::remove_all(dir_ / "out");
    const ConvertReport r = convert("hf", "out", ExpertLayout::Single, limit);
    size_t shards = 0;
    for (const std::string& f : r.output_files) {
      if (f.find(".index.json") != std::string::npos) continue;
      ++shards;
      const SafetensorsFile s = load_safetensors((dir_ / "out" / f).string());
      uint64_t bytes = 0;
      for (const auto& [name, t] : s.tensors) bytes += t.nbytes();
      if (s.tensors.size() > 1) {
        EXPECT_LE(bytes, limit) << f;
      }
    }
    EXPECT_EQ(r.output_files.back(), "model.safetensors.index.json");
    EXPECT_EQ(r.output_files.front(), shard_file_name(CheckpointFormat::Safetensors, 0, shards));
    expect_exact_index(dir_ / "out");
  }
}

TEST_F(ConvertDirTest, OneShardIsAPlainModelFileWithoutAnIndex) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  const ConvertReport r = convert("hf", "out", ExpertLayout::Single);  // 5 GB shards
  EXPECT_EQ(r.output_files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "model.safetensors.index.json"));
  expect_same_dict(load_checkpoint(path("out")).tensors, hf_state_dict({}, true));
}

TEST_F(ConvertDirTest, FilesAndDirectoriesConvertIntoEachOther) {
  const StateDict sd = hf_state_dict({}, false);
  save_safetensors(path("one.safetensors"), sd);
  convert("one.safetensors", "dir", ExpertLayout::Single, 1000);
  expect_same_dict(load_checkpoint(path("dir")).tensors, hf_state_dict({}, true));
  EXPECT_FALSE(fs::exists(dir_ / "dir" / "config.json"));  // nothing added
  const ConvertReport r = convert("dir", "back.safetensors", ExpertLayout::PerExpert);
  EXPECT_FALSE(r.directory_output);
  EXPECT_TRUE(fs::is_regular_file(dir_ / "back.safetensors"));
  EXPECT_EQ(read_all(dir_ / "back.safetensors"), read_all(dir_ / "one.safetensors"));
}

TEST_F(ConvertDirTest, BinShardsWithTheirIndex) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  o.format = CheckpointFormat::Pt;
  o.max_shard_size = 1000;
  const ConvertReport r = convert_checkpoint(path("hf"), path("bin"), o);
  EXPECT_EQ(r.output_files.back(), "pytorch_model.bin.index.json");
  EXPECT_EQ(r.output_files.front().rfind("pytorch_model-00001-of-", 0), 0u);
  const Checkpoint c = load_checkpoint(path("bin"));
  EXPECT_EQ(c.format, CheckpointFormat::Pt);
  expect_same_dict(c.tensors, hf_state_dict({}, true));
  EXPECT_EQ(c.model_type, "qwen3_moe");
}

TEST_F(ConvertDirTest, OtherFilesAreCopiedAndOtherWeightsSkipped) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  fs::create_directories(dir_ / "hf" / "original");
  write_text(dir_ / "hf" / "original" / "params.json", "{\"dim\": 6}");
  write_text(dir_ / "hf" / "original" / "consolidated.00.pth", "weights");
  write_text(dir_ / "hf" / "pytorch_model.bin.index.json", "{}");
  write_text(dir_ / "hf" / "generation_config.json", "{}");
  const ConvertReport r = convert("hf", "out", ExpertLayout::Single);
  EXPECT_EQ(r.copied_files, (std::vector<std::string>{"config.json", "generation_config.json",
                                                      "original/params.json", "tokenizer.json"}));
  EXPECT_EQ(r.skipped_files, (std::vector<std::string>{"original/consolidated.00.pth",
                                                       "pytorch_model.bin.index.json"}));
  EXPECT_EQ(read_all(dir_ / "out" / "original" / "params.json"), "{\"dim\": 6}");
  EXPECT_FALSE(fs::exists(dir_ / "out" / "original" / "consolidated.00.pth"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "pytorch_model.bin.index.json"));
}

TEST_F(ConvertDirTest, ExpertSlicesOfADirectory) {
  const HfSpec spec{.experts = 8};
  write_sharded(dir_ / "hf", hf_state_dict(spec, false));
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  o.experts = ExpertRange{4, 8};
  convert_checkpoint(path("hf"), path("rank1"), o);
  const StateDict got = load_checkpoint(path("rank1")).tensors;
  const StateDict all = hf_state_dict(spec, true);
  const Tensor& w = got.at("model.layers.1.mlp.experts.gate_up_proj");
  ASSERT_EQ(w.shape()[0], 4);
  for (int64_t e = 0; e < 4; ++e) {
    EXPECT_TRUE(
        w.select(e).bit_equal(all.at("model.layers.1.mlp.experts.gate_up_proj").select(4 + e)));
  }
}

// Every file under `dir`, relative to it, with its bytes; folders as "name/" with no bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).generic_string();
    out[e.is_directory() ? rel + "/" : rel] = e.is_directory() ? "" : read_all(e.path());
  }
  return out;
}

// A previous output of the same conversion (more shards than now, an index, the copied files)
// and a stale shard of an older one are replaced whole, and only when asked.
TEST_F(ConvertDirTest, AnExistingOutputIsReplacedWholeOnlyWhenAsked) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  fs::create_directories(dir_ / "hf" / "original");
  write_text(dir_ / "hf" / "original" / "params.json", "{}");
  convert("hf", "out", ExpertLayout::PerExpert, 500);
  ASSERT_TRUE(fs::exists(dir_ / "out" / "model.safetensors.index.json"));
  write_text(dir_ / "out" / "model-00042-of-00042.safetensors", "a stale shard");
  const std::map<std::string, std::string> before = snapshot(dir_ / "out");
  try {
    convert("hf", "out", ExpertLayout::Single);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(e.message().find("--force"), std::string::npos) << e.what();
  }
  EXPECT_EQ(snapshot(dir_ / "out"), before);
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  o.overwrite = true;
  convert_checkpoint(path("hf"), path("out"), o);
  expect_same_dict(load_checkpoint(path("out")).tensors, hf_state_dict({}, true));
  // One shard now, no index, and nothing of the old directory left.
  std::vector<std::string> now;
  for (const auto& [name, bytes] : snapshot(dir_ / "out")) now.push_back(name);
  EXPECT_EQ(now, (std::vector<std::string>{"config.json", "model.safetensors", "original/",
                                           "original/params.json", "tokenizer.json"}));
  // Nothing else beside it: the old directory went with the exchange.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"hf", "out"}));
}

// Regression: `convert DIR OUT --force` exchanged an existing directory OUT with the new one and
// removed it whole, so a thesis.tex or a folder of one's own kept in OUT was deleted. --force now
// replaces a directory only when it holds nothing but what a conversion writes there; anything
// else is refused, named, and left byte for byte, and nothing is written.
TEST_F(ConvertDirTest, ForceNeverDeletesWhatTheConversionDoesNotWrite) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  fs::create_directories(dir_ / "hf" / "original");
  write_text(dir_ / "hf" / "original" / "params.json", "{}");
  // What a conversion writes there: accepted. What it does not: refused.
  fs::create_directories(dir_ / "out" / "notes" / "drafts");
  fs::create_directories(dir_ / "out" / "original");
  write_text(dir_ / "out" / "model-00001-of-00002.safetensors", "an old shard");
  write_text(dir_ / "out" / "config.json", "an old config");
  write_text(dir_ / "out" / "original" / "params.json", "old params");
  write_text(dir_ / "out" / "thesis.tex", "\\documentclass{book} three years of work");
  write_text(dir_ / "out" / "notes" / "drafts" / "ch1.txt", "chapter one");
  write_text(dir_ / "out" / "original" / "mine.txt", "mine");
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  o.overwrite = true;
  auto expect_refused = [&](const std::string& listed) {
    const std::map<std::string, std::string> before = snapshot(dir_ / "out");
    try {
      convert_checkpoint(path("hf"), path("out"), o);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::OutputHoldsOtherFiles) << e.what();
      EXPECT_NE(e.message().find("converting \"" + path("hf") + "\": the output \"" + path("out") +
                                 "\" holds " + listed),
                std::string::npos)
          << e.message();
    }
    EXPECT_EQ(snapshot(dir_ / "out"), before);
    std::vector<std::string> beside;
    for (const auto& e : fs::directory_iterator(dir_)) beside.push_back(e.path().filename());
    std::sort(beside.begin(), beside.end());
    EXPECT_EQ(beside, (std::vector<std::string>{"hf", "out"})) << "nothing written beside OUT";
  };
  expect_refused(
      "3 entries that a conversion does not write: \"notes/\", \"original/mine.txt\", "
      "\"thesis.tex\"; --force replaces a directory only when it holds nothing but shards, an "
      "index and files copied from the input");
  // At most five are named.
  for (const char* f : {"a.txt", "b.txt", "c.txt", "d.txt"}) write_text(dir_ / "out" / f, f);
  expect_refused(
      "7 entries that a conversion does not write: \"a.txt\", \"b.txt\", \"c.txt\", "
      "\"d.txt\", \"notes/\" and 2 more;");
  // The same from a single file: nothing is copied, so config.json is another's file too.
  save_safetensors(path("one.safetensors"), hf_state_dict({}, false));
  o.max_shard_size = 1000;
  try {
    convert_checkpoint(path("one.safetensors"), path("out"), o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutputHoldsOtherFiles) << e.what();
    EXPECT_NE(e.message().find("\"config.json\""), std::string::npos) << e.message();
  }
  // Once only what a conversion writes is left, --force replaces it.
  for (const char* f : {"a.txt", "b.txt", "c.txt", "d.txt", "thesis.tex", "original/mine.txt"}) {
    fs::remove(dir_ / "out" / f);
  }
  fs::remove_all(dir_ / "out" / "notes");
  o.max_shard_size.reset();
  convert_checkpoint(path("hf"), path("out"), o);
  expect_same_dict(load_checkpoint(path("out")).tensors, hf_state_dict({}, true));
  EXPECT_EQ(read_all(dir_ / "out" / "config.json"), read_all(dir_ / "hf" / "config.json"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "model-00001-of-00002.safetensors"));
}

// "out/" is the directory "out", new or replaced, not a place inside it.
TEST_F(ConvertDirTest, AnOutputNamedWithATrailingSlashIsThatDirectory) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  convert_checkpoint(path("hf/"), path("out/"), o);
  expect_same_dict(load_checkpoint(path("out")).tensors, hf_state_dict({}, true));
  o.overwrite = true;
  o.layout = ExpertLayout::PerExpert;
  convert_checkpoint(path("hf/"), path("out/"), o);
  expect_same_dict(load_checkpoint(path("out")).tensors, hf_state_dict({}, false));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"hf", "out"}));
  for (const auto& e : fs::directory_iterator(dir_ / "out")) {
    EXPECT_FALSE(fs::is_directory(e.path())) << "nothing nested: " << e.path();
  }
  EXPECT_THROW(convert_checkpoint(path("hf/"), path("hf/"), o), Error);
}

TEST_F(ConvertDirTest, AFailureMidwayLeavesNothing) {
  write_sharded(dir_ / "hf", hf_state_dict({.experts = 8}, false));
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  o.max_shard_size = 500;
  int calls = 0;
  o.progress = [&](uint64_t done, uint64_t) {
    if (done > 0 && ++calls == 1) throw Error(ErrorCode::Interrupted, "stop");
  };
  EXPECT_THROW(convert_checkpoint(path("hf"), path("out"), o), Error);
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename(), "hf") << "left behind: " << e.path();
  }
}

TEST_F(ConvertDirTest, TheOutputIsNeverInsideOrOverTheInput) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  ConvertOptions o;
  o.overwrite = true;
  for (const std::string& out : {path("hf"), path("hf/sub"), dir_.string(), path("hf/") + "."}) {
    SCOPED_TRACE(out);
    try {
      convert_checkpoint(path("hf"), out, o);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    }
  }
  // A file input inside the output directory: replacing it would delete the input.
  save_safetensors(path("hf/one.safetensors"), hf_state_dict({}, false));
  EXPECT_THROW(convert_checkpoint(path("hf/one.safetensors"), path("hf"), o), Error);
  expect_same_dict(load_checkpoint(path("hf/one.safetensors")).tensors, hf_state_dict({}, false));
}

}  // namespace
}  // namespace grouplin
