// Sharded checkpoint directories: the index format, Hugging Face's sharding rule and size
// notation, reading a directory as one state dict (index, no index, links), and every way a
// directory can be wrong, through load_checkpoint, inspect_checkpoint and convert_checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "grouplin/grouplin.hpp"
#include "hostile_text.hpp"
#include "io/error_code_groups.hpp"
#include "io/moe_checkpoint.hpp"
#include "io/same_dict.hpp"
#include "io/sharded_dir.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using testing::expect_same_dict;
using testing::hf_state_dict;
using testing::HfSpec;
using testing::write_sharded;
using testing::write_text;

ErrorCode error_of(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.message();
    return e.code();
  }
  ADD_FAILURE() << "no error";
  return ErrorCode::InvalidArgument;
}

TEST(ShardIndex, ParsesTotalsAndTheWeightMapSortedByKey) {
  const ShardIndex i = parse_shard_index(
      R"({"metadata": {"total_size": 96, "total_parameters": 48, "format": "pt"},
          "weight_map": {"b": "model-00002-of-00002.safetensors", "a": "sub/x.safetensors"}})",
      "ctx");
  EXPECT_EQ(i.total_size, 96u);
  EXPECT_EQ(i.total_parameters, 48u);
  ASSERT_EQ(i.weight_map.size(), 2u);
  EXPECT_EQ(i.weight_map[0], (std::pair<std::string, std::string>("a", "sub/x.safetensors")));
  EXPECT_EQ(i.weight_map[1].first, "b");
  const ShardIndex bare = parse_shard_index(R"({"weight_map": {}})", "ctx");
  EXPECT_FALSE(bare.total_size.has_value());
  EXPECT_TRUE(bare.weight_map.empty());
}

TEST(ShardIndex, EveryMalformedIndexHasItsError) {
  struct Case {
    const char* json;
    ErrorCode code;
  };
  const std::string deep = std::string(20, '[') + std::string(20, ']');
  const std::string deep_index = R"({"metadata": {"x": )" + deep + R"(}, "weight_map": {}})";
  const Case cases[] = {
      {"{", ErrorCode::InvalidIndex},
      {"", ErrorCode::InvalidIndex},
      {"[]", ErrorCode::InvalidIndex},
      {R"({"metadata": {}})", ErrorCode::InvalidIndex},
      {R"({"weight_map": []})", ErrorCode::InvalidIndex},
      {R"({"weight_map": {"a": 3}})", ErrorCode::InvalidIndex},
      {R"({"metadata": "x", "weight_map": {}})", ErrorCode::InvalidIndex},
      {R"({"metadata": {"total_size": -1}, "weight_map": {}})", ErrorCode::InvalidIndex},
      {R"({"metadata": {"total_size": 1.5}, "weight_map": {}})", ErrorCode::InvalidIndex},
      {R"({"metadata": {"total_size": "96"}, "weight_map": {}})", ErrorCode::InvalidIndex},
      {deep_index.c_str(), ErrorCode::InvalidIndex},
      {R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})", ErrorCode::DuplicateName},
      {R"({"weight_map": {}, "weight_map": {}})", ErrorCode::DuplicateName},
      {R"({"weight_map": {"a": "/etc/passwd"}})", ErrorCode::UnsafePath},
      {R"({"weight_map": {"a": "../model.safetensors"}})", ErrorCode::UnsafePath},
      {R"({"weight_map": {"a": "sub/../../x.safetensors"}})", ErrorCode::UnsafePath},
      {R"({"weight_map": {"a": "./x.safetensors"}})", ErrorCode::UnsafePath},
      {R"({"weight_map": {"a": "sub//x.safetensors"}})", ErrorCode::UnsafePath},
      {R"({"weight_map": {"a": ""}})", ErrorCode::UnsafePath},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    std::string message;
    EXPECT_EQ(error_of([&] { parse_shard_index(c.json, "reading \"i.json\""); }, &message), c.code);
    EXPECT_EQ(message.rfind("reading \"i.json\": ", 0), 0u) << message;
  }
}

TEST(ShardIndex, IsWrittenAsTransformersWritesIt) {
  ShardIndex i;
  i.total_size = 100;
  i.weight_map = {{"a.weight", "model-00001-of-00002.safetensors"},
                  {"caf\xc3\xa9", "model-00002-of-00002.safetensors"}};
  // json.dumps(index, indent=2, sort_keys=True) + "\n"
  EXPECT_EQ(shard_index_json(i),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_size\": 100\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"a.weight\": \"model-00001-of-00002.safetensors\",\n"
            "    \"caf\\u00e9\": \"model-00002-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
  i.total_parameters = 50;
  const ShardIndex back = parse_shard_index(shard_index_json(i), "ctx");
  EXPECT_EQ(back.total_parameters, 50u);
  EXPECT_EQ(back.weight_map, i.weight_map);
}

TEST(ShardPlan, FollowsHuggingFacesRule) {
  using Plan = std::vector<std::vector<size_t>>;
  auto plan = [](std::vector<uint64_t> sizes, uint64_t max) { return plan_shards(sizes, max); };
  EXPECT_EQ(plan({}, 8), Plan{});
  EXPECT_EQ(plan({4, 4, 4}, 8), (Plan{{0, 1}, {2}}));
  EXPECT_EQ(plan({4, 4}, 8), (Plan{{0, 1}}));  // exactly the limit fits
  EXPECT_EQ(plan({0, 0, 8}, 8), (Plan{{0, 1, 2}}));
  // A tensor over the limit gets a shard of its own, before the one being filled.
  EXPECT_EQ(plan({3, 20, 3, 3}, 8), (Plan{{1}, {0, 2}, {3}}));
  EXPECT_EQ(plan({20, 30}, 8), (Plan{{0}, {1}}));
}

TEST(ShardNames, AreHuggingFacesNames) {
  EXPECT_EQ(shard_file_name(CheckpointFormat::Safetensors, 0, 3),
            "model-00001-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(CheckpointFormat::Pt, 11, 12), "pytorch_model-00012-of-00012.bin");
  EXPECT_EQ(shard_file_name(CheckpointFormat::Safetensors, 0, 1), "model.safetensors");
  EXPECT_EQ(shard_file_name(CheckpointFormat::Pt, 0, 1), "pytorch_model.bin");
  EXPECT_EQ(shard_index_file_name(CheckpointFormat::Safetensors), "model.safetensors.index.json");
  EXPECT_EQ(shard_index_file_name(CheckpointFormat::Pt), "pytorch_model.bin.index.json");
}

// Regression: nlohmann's parse errors repeat the index's last token with only C0 controls
// spelled out, and an index whose "total_size" was a string printed it raw: a hostile index put
// DEL, C1 controls or direction overrides into GroupLin's messages, and so onto the terminal.
TEST(ShardIndex, ParserTextInMessagesIsEscaped) {
  for (const test_text::HostileControl& c : test_text::kHostileControls) {
    SCOPED_TRACE(c.escaped);
    std::string message;
    // A control character ends the string token after the hostile one.
    const std::string broken = R"({"weight_map": {"a": "x)" + c.raw + "\x01\"}}";
    EXPECT_EQ(error_of([&] { parse_shard_index(broken, "reading \"i.json\""); }, &message),
              ErrorCode::InvalidIndex);
    EXPECT_NE(message.find("not JSON"), std::string::npos) << message;
    test_text::expect_escaped(message, c);
    const std::string total =
        R"({"metadata": {"total_size": "1)" + c.raw + R"("}, "weight_map": {}})";
    EXPECT_EQ(error_of([&] { parse_shard_index(total, "reading \"i.json\""); }, &message),
              ErrorCode::InvalidIndex);
    test_text::expect_escaped(message, c);
  }
  // A long token is cut: the message does not grow with the file.
  std::string message;
  error_of([&] { parse_shard_index(R"({"a": ")" + std::string(100000, 'k') + "\x01", "i"); },
           &message);
  EXPECT_LT(message.size(), 400u) << message;
}

TEST(ByteSize, ParsesHuggingFacesUnits) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("40KB"), 40'000u);
  EXPECT_EQ(parse_byte_size("40kB"), 40'000u);
  EXPECT_EQ(parse_byte_size("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(parse_byte_size("1KiB"), 1024u);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 1'610'612'736u);
  EXPECT_EQ(parse_byte_size("0.5MB"), 500'000u);
  EXPECT_EQ(parse_byte_size("123"), 123u);
  EXPECT_EQ(parse_byte_size("10B"), 10u);
  // Regression: sharded_checkpoint.hpp promised case-insensitive units that the parser refused.
  // Binary units are read in any case, as transformers reads them.
  EXPECT_EQ(parse_byte_size("2gib"), 2u << 30);
  EXPECT_EQ(parse_byte_size("2GIB"), 2u << 30);
  EXPECT_EQ(parse_byte_size("3mIb"), 3u << 20);
  EXPECT_EQ(parse_byte_size("1tib"), uint64_t{1} << 40);
  EXPECT_EQ(parse_byte_size("5gB"), 5'000'000'000u);
  for (const char* bad : {"", "GB", "5 GB", "5XB", "5GiBB", "0", "0KB", "-1", "5Gb", "5kb", "5gb",
                          "5b", "5Gib5", "5GIBb", "20000000000000000000", "17000000TiB", "1.2.3"}) {
    SCOPED_TRACE(bad);
    std::string message;
    EXPECT_EQ(error_of([&] { parse_byte_size(bad); }, &message), ErrorCode::InvalidArgument);
    EXPECT_NE(message.find("the size \""), std::string::npos) << message;
  }
  // A decimal unit with a lower-case b is bits to transformers: refused as ambiguous.
  for (const char* bits : {"5gb", "5Gb", "40kb", "2tb"}) {
    std::string message;
    EXPECT_EQ(error_of([&] { parse_byte_size(bits); }, &message), ErrorCode::InvalidArgument);
    EXPECT_NE(message.find("is ambiguous"), std::string::npos) << message;
  }
}

class ShardedDirTest : public test_files::TempDirTest {
 protected:
  ShardedDirTest() : TempDirTest("grouplin_sharded") {}
  fs::path in() const { return dir_ / "in"; }
};

TEST_F(ShardedDirTest, LoadsEveryShardAsOneDict) {
  const StateDict sd = hf_state_dict({}, false);
  write_sharded(in(), sd);
  const Checkpoint c = load_checkpoint(in().string());
  expect_same_dict(c.tensors, sd);
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.shards, (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                                "model-00002-of-00003.safetensors",
                                                "model-00003-of-00003.safetensors"}));
  EXPECT_EQ(c.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));

  const CheckpointSummary s = inspect_checkpoint(in().string());
  EXPECT_TRUE(s.directory);
  EXPECT_EQ(s.index_file, "model.safetensors.index.json");
  EXPECT_EQ(s.other_files, (std::vector<std::string>{"config.json", "tokenizer.json"}));
  ASSERT_EQ(s.scan.modules.size(), 2u);
  EXPECT_EQ(s.scan.modules[0].rules, "qwen3_moe");  // config.json names the family
  uint64_t bytes = 0;
  for (const std::string& f : c.shards) bytes += fs::file_size(in() / f);
  EXPECT_EQ(s.file_bytes, bytes);
}

TEST_F(ShardedDirTest, WithoutAnIndexEverySafetensorsFileIsAShard) {
  const StateDict sd = hf_state_dict({}, false);
  write_sharded(in(), sd, {.shards = 2, .index = false});
  expect_same_dict(load_checkpoint(in().string()).tensors, sd);
  EXPECT_EQ(inspect_checkpoint(in().string()).index_file, "");
}

// A model saved whole as one pickle (pytorch_model.bin without an index, model.pt): its one
// shard. Several such files say which; beside safetensors shards they are not read.
TEST_F(ShardedDirTest, OnePickleWithoutAnIndexIsTheOnlyShard) {
  const StateDict sd = hf_state_dict({}, false);
  for (const char* name : {"pytorch_model.bin", "model.pt"}) {
    SCOPED_TRACE(name);
    fs::remove_all(in());
    fs::create_directories(in());
    save_pt((in() / name).string(), sd);
    write_text(in() / "config.json", R"({"model_type": "qwen3_moe"})");
    expect_same_dict(load_checkpoint(in().string()).tensors, sd);
    const CheckpointSummary s = inspect_checkpoint(in().string());
    EXPECT_EQ(s.format, CheckpointFormat::Pt);
    EXPECT_EQ(s.shards, std::vector<std::string>{name});
    EXPECT_EQ(s.scan.modules.size(), 2u);
  }
  save_pt((in() / "pytorch_model.bin").string(), sd);  // beside model.pt: which one?
  try {
    inspect_checkpoint(in().string());
    ADD_FAILURE() << "two pickles read as one model";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::UnknownFormat);
    EXPECT_NE(std::string(e.what()).find("(\"model.pt\", \"pytorch_model.bin\")"),
              std::string::npos)
        << e.what();
  }
  fs::remove(in() / "model.pt");
  write_sharded(in(), sd, {.shards = 2, .index = false});  // safetensors shards win
  const CheckpointSummary s = inspect_checkpoint(in().string());
  EXPECT_EQ(s.format, CheckpointFormat::Safetensors);
  EXPECT_EQ(s.skipped_files, std::vector<std::string>{"pytorch_model.bin"});
}

// The Hugging Face cache: snapshots/<rev>/ holds links to ../../blobs/<hash>.
TEST_F(ShardedDirTest, LinkedShardsAreFollowedAndOutputsHoldTheirBytes) {
  const StateDict sd = hf_state_dict({}, false);
  write_sharded(dir_ / "staging", sd, {.shards = 2});
  const fs::path blobs = dir_ / "hub" / "blobs", snap = dir_ / "hub" / "snapshots" / "abc";
  fs::create_directories(blobs);
  fs::create_directories(snap);
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "staging")) {
    const std::string blob = "blob" + std::to_string(n++);
    fs::rename(e.path(), blobs / blob);
    fs::create_symlink(fs::path("../../blobs") / blob, snap / e.path().filename());
  }
  expect_same_dict(load_checkpoint(snap.string()).tensors, sd);
  ConvertOptions o;
  o.layout = ExpertLayout::Single;
  convert_checkpoint(snap.string(), path("out"), o);
  for (const auto& e : fs::directory_iterator(path("out"))) {
    EXPECT_FALSE(fs::is_symlink(e.symlink_status())) << e.path();
  }
  EXPECT_EQ(test_files::read_all(dir_ / "out" / "config.json"),
            test_files::read_all(snap / "config.json"));
  expect_same_dict(load_checkpoint(path("out")).tensors, hf_state_dict({}, true));

  // The cache folder itself (hub/models--org--name) reads as the snapshot refs/main names.
  fs::create_directories(dir_ / "hub" / "refs");
  write_text(dir_ / "hub" / "refs" / "main", "abc\n");
  expect_same_dict(load_checkpoint(path("hub")).tensors, sd);
  EXPECT_EQ(inspect_checkpoint(path("hub")).snapshot, "snapshots/abc");
  convert_checkpoint(path("hub"), path("from_cache"), o);
  expect_same_dict(load_checkpoint(path("from_cache")).tensors, hf_state_dict({}, true));
  for (const auto& [rev, code] :
       {std::pair<std::string, ErrorCode>{"../abc", ErrorCode::UnsafePath},
        {"def", ErrorCode::IoError}}) {
    write_text(dir_ / "hub" / "refs" / "main", rev);
    try {
      inspect_checkpoint(path("hub"));
      ADD_FAILURE() << rev;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find("Hugging Face cache folder"), std::string::npos)
          << e.what();
    }
  }
}

// Each broken directory: what breaks it, and the code every reader gives.
struct BrokenDir {
  const char* name;
  std::function<void(const fs::path&)> make;
  ErrorCode code;
};

std::string index_text(const fs::path& dir) {
  return test_files::read_all(dir / "model.safetensors.index.json");
}
void edit_index(const fs::path& dir, const std::string& from, const std::string& to) {
  std::string text = index_text(dir);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  write_text(dir / "model.safetensors.index.json", text);
}

std::vector<BrokenDir> broken_dirs() {
  const StateDict sd = hf_state_dict({}, false);
  return {
      {"index names a missing shard",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         fs::remove(d / "model-00002-of-00003.safetensors");
       },
       ErrorCode::ShardMissing},
      {"a shard lacks a tensor the index names",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         edit_index(d, "\"weight_map\": {",
                    "\"weight_map\": {\"ghost\": \"model-00001-of-00003.safetensors\",");
       },
       ErrorCode::TensorNotInShard},
      {"the index puts a tensor in the wrong shard",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         edit_index(d, "\"model.embed_tokens.weight\": \"model-00001-of-00003.safetensors\"",
                    "\"model.embed_tokens.weight\": \"model-00002-of-00003.safetensors\"");
       },
       ErrorCode::TensorNotInShard},
      {"a tensor in two shards",
       [sd](const fs::path& d) {
         write_sharded(d, sd, {.shards = 2, .index = false});
         StateDict extra;
         extra.insert("model.embed_tokens.weight", sd.at("model.embed_tokens.weight"));
         save_safetensors((d / "model-extra.safetensors").string(), extra);
       },
       ErrorCode::DuplicateName},
      {"a tensor in a shard but not in the index",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         edit_index(d, "\"model.embed_tokens.weight\": \"model-00001-of-00003.safetensors\",", "");
       },
       ErrorCode::TensorNotInIndex},
      {"a shard name that climbs out",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         edit_index(d, "\"model.embed_tokens.weight\": \"model-00001",
                    "\"model.embed_tokens.weight\": \"../in/model-00001");
       },
       ErrorCode::UnsafePath},
      {"an absolute shard name",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         edit_index(d, "\"model.embed_tokens.weight\": \"model-00001",
                    "\"model.embed_tokens.weight\": \"" + d.string() + "/model-00001");
       },
       ErrorCode::UnsafePath},
      {"an index that is no JSON",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         write_text(d / "model.safetensors.index.json", "{\"weight_map\": ");
       },
       ErrorCode::InvalidIndex},
      {"no index and no safetensors file",
       [](const fs::path& d) {
         fs::create_directories(d);
         write_text(d / "config.json", "{}");
       },
       ErrorCode::UnknownFormat},
      {"shards of two formats",
       [sd](const fs::path& d) {
         write_sharded(d, sd, {.shards = 2});
         const std::string shard = (d / "model-00002-of-00002.safetensors").string();
         save_pt(shard, load_safetensors(shard).tensors);  // atomic: the mapping stays valid
       },
       ErrorCode::UnknownFormat},
      {"a shard that is no valid safetensors file",
       [sd](const fs::path& d) {
         write_sharded(d, sd);
         // A header of 2 bytes, "{}", then bytes that no tensor accounts for.
         write_text(d / "model-00003-of-00003.safetensors",
                    std::string("\x02\0\0\0\0\0\0\0{}xyz", 13));
       },
       ErrorCode::TrailingBytes},
  };
}

TEST_F(ShardedDirTest, EveryBrokenDirectoryIsRefusedByEveryReaderAndWritesNothing) {
  for (const BrokenDir& b : broken_dirs()) {
    SCOPED_TRACE(b.name);
    fs::remove_all(in());
    b.make(in());
    std::string message;
    EXPECT_EQ(error_of([&] { load_checkpoint(in().string()); }, &message), b.code) << message;
    EXPECT_NE(message.find(in().string()), std::string::npos) << message;
    EXPECT_EQ(error_of([&] { inspect_checkpoint(in().string()); }), b.code);
    EXPECT_EQ(error_of([&] { compare_checkpoints(in().string(), in().string()); }), b.code);
    EXPECT_EQ(error_of([&] { convert_checkpoint(in().string(), path("out"), {}); }), b.code);
    EXPECT_FALSE(fs::exists(path("out")));
    for (const auto& e : fs::directory_iterator(dir_)) {
      EXPECT_EQ(e.path().filename().string().find(".out"), std::string::npos) << e.path();
    }
  }
}

// Regression: an index whose total_size was not its tensors' bytes was refused by every reader
// (TotalSizeMismatch), though transformers never reads the field. It is a warning now: every
// reader goes on and reports it, with both numbers, and convert writes an exact index.
TEST_F(ShardedDirTest, AWrongTotalSizeIsAWarningNotARefusal) {
  const StateDict sd = hf_state_dict({}, false);
  write_sharded(in(), sd);
  const ShardIndex exact = parse_shard_index(index_text(in()), "index");
  const std::string real = std::to_string(*exact.total_size);
  const std::string claimed = "1" + real;
  edit_index(in(), "\"total_size\": " + real, "\"total_size\": " + claimed);
  auto expect_warning = [&](const std::vector<Problem>& warnings) {
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0].code, ErrorCode::TotalSizeMismatch);
    EXPECT_EQ(warnings[0].key, "model.safetensors.index.json");
    EXPECT_NE(warnings[0].message.find("gives total_size " + claimed +
                                       ", but the tensors of its shards hold " + real + " bytes"),
              std::string::npos)
        << warnings[0].message;
  };
  const Checkpoint c = load_checkpoint(in().string());
  expect_same_dict(c.tensors, sd);
  expect_warning(c.warnings);
  expect_warning(inspect_checkpoint(in().string()).warnings);
  const CompareReport same = compare_checkpoints(in().string(), in().string());
  EXPECT_TRUE(same.same);
  EXPECT_EQ(same.warnings.size(), 2u);  // A's, then B's
  ConvertOptions o;
  o.layout = ExpertLayout::PerExpert;
  o.max_shard_size = 1000;
  const ConvertReport r = convert_checkpoint(in().string(), path("out"), o);
  expect_warning(r.warnings);
  EXPECT_EQ(parse_shard_index(index_text(dir_ / "out"), "index").total_size, exact.total_size);
  // A directory without the mistake has no warning.
  EXPECT_TRUE(load_checkpoint(path("out")).warnings.empty());
  EXPECT_TRUE(inspect_checkpoint(path("out")).warnings.empty());
}

TEST_F(ShardedDirTest, EveryDirectoryErrorCodeHasABrokenDirectory) {
  const std::vector<BrokenDir> cases = broken_dirs();
  for (ErrorCode code : {ErrorCode::InvalidIndex, ErrorCode::UnsafePath, ErrorCode::ShardMissing,
                         ErrorCode::TensorNotInShard, ErrorCode::TensorNotInIndex}) {
    EXPECT_TRUE(test_io::raised_only_by_checkpoint_directories(code)) << error_code_name(code);
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(), [&](const BrokenDir& b) {
      return b.code == code;
    })) << error_code_name(code);
  }
}

// One expert's tensors in different shards, with different shapes or dtypes: the scan sees the
// experts of a module together whatever shard holds them.
TEST_F(ShardedDirTest, ExpertsThatDisagreeAcrossShardsAreRefused) {
  for (ErrorCode code : {ErrorCode::ShapeMismatch, ErrorCode::DTypeMismatch}) {
    SCOPED_TRACE(error_code_name(code));
    fs::remove_all(in());
    StateDict sd;
    for (const auto& [name, t] : hf_state_dict({}, false)) {
      const bool odd = name == "model.layers.0.mlp.experts.3.up_proj.weight";
      if (!odd) {
        sd.insert(name, t);
      } else if (code == ErrorCode::ShapeMismatch) {
        sd.insert(name, Tensor::zeros({t.shape()[0] + 1, t.shape()[1]}, t.dtype()));
      } else {
        sd.insert(name, Tensor::zeros(t.shape(), DType::F32));
      }
    }
    write_sharded(in(), sd);
    EXPECT_EQ(load_checkpoint(in().string()).tensors.size(), sd.size());  // a valid dict
    const CheckpointSummary s = inspect_checkpoint(in().string());
    ASSERT_EQ(s.scan.problems.size(), 1u);
    EXPECT_EQ(s.scan.problems[0].code(), code);
    std::string message;
    EXPECT_EQ(error_of([&] { convert_checkpoint(in().string(), path("out"), {}); }, &message),
              code);
    EXPECT_NE(message.find("model.layers.0.mlp.experts."), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(path("out")));
  }
}

}  // namespace
}  // namespace grouplin
