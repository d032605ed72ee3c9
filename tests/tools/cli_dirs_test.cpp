// The command line on sharded checkpoint directories: convert both ways with --max-shard-size,
// inspect (text and JSON) and verify; broken directories and bad sizes exit 2 and write nothing;
// memory stays bounded on a 256 MiB directory; Ctrl-C leaves no temporary directory.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/error.hpp"
#include "io/moe_checkpoint.hpp"
#include "io/sharded_dir.hpp"
#include "temp_dir_test.hpp"
#include "tools/cli_runner.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using testing::hf_state_dict;
using testing::write_sharded;

class CliDirsTest : public test_files::TempDirTest {
 protected:
  CliDirsTest() : TempDirTest("grouplin_cli_dirs") {}
  CliRun run(const std::vector<std::string>& args) const { return run_cli(dir_, args); }
  // The entries of the test folder, hidden ones (the CLI's temporary directories) included.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string n = e.path().filename().string();
      if (n != ".stdout" && n != ".stderr") names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  // A large directory "hf" (48 MiB of F32 experts per layer) written by a child process, so
  // that this process, whose peak resident set the CLI's children inherit in ru_maxrss, never
  // holds the dict.
  void write_large(int64_t layers, size_t shards) const {
    const pid_t maker = ::fork();
    ASSERT_GE(maker, 0);
    if (maker == 0) {
      write_sharded(
          dir_ / "hf",
          hf_state_dict(
              {.layers = layers, .experts = 32, .hidden = 512, .inter = 256, .dtype = DType::F32},
              false),
          {.shards = shards});
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(maker, &status, 0), maker);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
};

TEST_F(CliDirsTest, ConvertsInspectsAndVerifiesDirectories) {
  write_sharded(dir_ / "hf", hf_state_dict({.experts = 8}, false));
  CliRun r =
      run({"convert", path("hf"), path("fused"), "--layout", "single", "--max-shard-size", "2KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("safetensors directory"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 other file(s) copied"), std::string::npos) << r.out;

  r = run({"inspect", path("fused"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["directory"], true);
  EXPECT_EQ(doc["index_file"], "model.safetensors.index.json");
  EXPECT_GE(doc["shards"].size(), 2u);
  EXPECT_EQ(doc["other_files"], nlohmann::json::array({"config.json", "tokenizer.json"}));
  EXPECT_EQ(doc["model_type"], "qwen3_moe");
  EXPECT_EQ(doc["grouped_modules"][0]["layout"], "single");

  r = run({"inspect", path("hf")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("safetensors directory, 3 shard(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model_type: qwen3_moe"), std::string::npos) << r.out;

  r = run({"convert", path("fused"), path("back"), "--layout", "per-expert"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* other : {"fused", "back"}) {
    r = run({"verify", path("hf"), path(other)});
    EXPECT_EQ(r.code, 0) << other << ": " << r.out << r.err;
  }
  // A directory to one file, and verify across the two kinds.
  r = run({"convert", path("hf"), path("one.safetensors"), "--layout", "single"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("left in " + path("hf") +
                       " (a file output holds tensors only; an "
                       "OUT without extension is a directory that gets them): config.json, "
                       "tokenizer.json\n"),
            std::string::npos)
      << r.out;
  r = run({"verify", path("one.safetensors"), path("back")});
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST_F(CliDirsTest, BrokenDirectoriesAndBadSizesExitTwoAndWriteNothing) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  fs::copy(dir_ / "hf", dir_ / "missing", fs::copy_options::recursive);
  fs::remove(dir_ / "missing" / "model-00002-of-00003.safetensors");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"convert", path("missing"), path("out"), "--layout", "single"}, "ShardMissing: "},
      {{"inspect", path("missing")}, "ShardMissing: "},
      {{"verify", path("missing"), path("hf")}, "ShardMissing: "},
      {{"convert", path("hf"), path("out"), "--layout", "single", "--max-shard-size", "5Gb"},
       "--max-shard-size: the size \"5Gb\" is ambiguous"},
      {{"convert", path("hf"), path("out"), "--layout", "single", "--max-shard-size", "0"},
       "--max-shard-size: the size \"0\" is zero"},
      {{"convert", path("hf"), path("hf/out"), "--layout", "single"}, "inside it"},
      {{"convert", path("hf"), path("hf"), "--layout", "single", "--force"}, "inside it"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args[0] + " " + c.says);
    const CliRun r = run(c.args);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(entries(), (std::vector<std::string>{"hf", "missing"}));
  }
  // An existing output needs --force.
  fs::create_directories(dir_ / "out");
  CliRun r = run({"convert", path("hf"), path("out"), "--layout", "single"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = run({"convert", path("hf"), path("out"), "--layout", "single", "--force"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(entries(), (std::vector<std::string>{"hf", "missing", "out"}));
}

// Regression: `grouplin convert DIR OUT --force` over an existing directory OUT deleted everything
// in it, a thesis.tex and a folder of one's own included. It now refuses (exit 2), names them,
// writes nothing and leaves them byte for byte; over a previous output of the same conversion it
// still works.
TEST_F(CliDirsTest, ForceKeepsWhatTheConversionDoesNotWrite) {
  write_sharded(dir_ / "hf", hf_state_dict({}, false));
  CliRun r = run({"convert", path("hf"), path("out"), "--layout", "single", "--max-shard-size",
                  "1KB", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  // A previous output (shards, index, config.json): replaced.
  r = run({"convert", path("hf"), path("out"), "--layout", "per-expert", "--force", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "model.safetensors.index.json"));

  const std::string thesis = "\\documentclass{book}\n% three years of work\n";
  testing::write_text(dir_ / "out" / "thesis.tex", thesis);
  fs::create_directories(dir_ / "out" / "data");
  testing::write_text(dir_ / "out" / "data" / "results.csv", "1,2,3\n");
  const std::string shard = test_files::read_all(dir_ / "out" / "model.safetensors");
  r = run({"convert", path("hf"), path("out"), "--layout", "single", "--force"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("grouplin: OutputHoldsOtherFiles: converting \"" + path("hf") +
                       "\": the output \"" + path("out") +
                       "\" holds 2 entries that a conversion does not write: \"data/\", "
                       "\"thesis.tex\"; --force replaces a directory only when"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(test_files::read_all(dir_ / "out" / "thesis.tex"), thesis);
  EXPECT_EQ(test_files::read_all(dir_ / "out" / "data" / "results.csv"), "1,2,3\n");
  EXPECT_EQ(test_files::read_all(dir_ / "out" / "model.safetensors"), shard);
  EXPECT_EQ(entries(), (std::vector<std::string>{"hf", "out"}));
}

// Regression: a directory whose index gave a total_size other than its tensors' bytes was refused
// by every command (exit 2, TotalSizeMismatch), though transformers never reads the field. Every
// command goes on now: inspect lists the warning (text and JSON), convert and verify say it on
// stderr, all exit 0, and the index convert writes is exact.
TEST_F(CliDirsTest, AWrongTotalSizeIsAWarningEveryCommandGoesOn) {
  const StateDict sd = hf_state_dict({}, false);
  write_sharded(dir_ / "hf", sd);
  uint64_t total = 0;
  for (const auto& [name, t] : sd) total += t.nbytes();
  const fs::path index = dir_ / "hf" / "model.safetensors.index.json";
  std::string text = test_files::read_all(index);
  const std::string field = "\"total_size\": " + std::to_string(total);
  ASSERT_NE(text.find(field), std::string::npos) << text;
  text.replace(text.find(field), field.size(), "\"total_size\": 7");
  testing::write_text(index, text);
  const std::string says = "TotalSizeMismatch: reading the checkpoint directory \"" + path("hf") +
                           "\": \"model.safetensors.index.json\" gives total_size 7, but the "
                           "tensors of its shards hold " +
                           std::to_string(total) + " bytes";

  CliRun r = run({"inspect", path("hf")});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warnings (readers go on):\n  " + says), std::string::npos) << r.out;
  r = run({"inspect", path("hf"), "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["warnings"].size(), 1u) << r.out;
  EXPECT_EQ(doc["warnings"][0]["code"], "TotalSizeMismatch");
  EXPECT_EQ(doc["warnings"][0]["key"], "model.safetensors.index.json");
  EXPECT_NE(doc["warnings"][0]["message"].get<std::string>().find("gives total_size 7"),
            std::string::npos);
  r = run({"convert", path("hf"), path("out"), "--layout", "single", "--max-shard-size", "1KB"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("grouplin: warning: " + says), std::string::npos) << r.err;
  r = run({"verify", path("hf"), path("out")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("grouplin: warning: " + says), std::string::npos) << r.err;
  // The output's index is exact: nothing to warn about.
  r = run({"inspect", path("out"), "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["warnings"], nlohmann::json::array());
  EXPECT_EQ(r.err, "");
}

// A 192 MiB directory of 8 shards, each expert's tensors spread over them, converts both ways
// with a peak resident set far below its size (ru_maxrss: stricter than RssAnon).
TEST_F(CliDirsTest, DirectoryConvertMemoryStaysBounded) {
  if (kUnderAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine blur resident-set figures";
  }
  ASSERT_NO_FATAL_FAILURE(write_large(4, 8));
  const long limit_kib = 48 * 1024;
  struct Step {
    const char* in;
    const char* out;
    const char* layout;
  };
  for (const Step& s : {Step{"hf", "fused", "single"}, Step{"fused", "back", "per-expert"}}) {
    CliRun r = run({"convert", path(s.in), path(s.out), "--layout", s.layout, "--max-shard-size",
                    "50MB", "--quiet"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_LT(r.max_rss_kib, limit_kib)
        << s.in << " -> " << s.out << ": peak RSS " << r.max_rss_kib << " KiB";
  }
  CliRun v = run({"verify", path("hf"), path("back")});
  EXPECT_EQ(v.code, 0) << v.out;
}

// Ctrl-C while a directory is being written: exit 130, and neither OUT nor its temporary
// directory is left.
TEST_F(CliDirsTest, InterruptLeavesNoDirectoryBehind) {
  ASSERT_NO_FATAL_FAILURE(write_large(2, 3));
  int status = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execl(GROUPLIN_CLI, GROUPLIN_CLI, "convert", path("hf").c_str(), path("out").c_str(),
              "--layout", "single", "--quiet", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    bool started = false;
    while (!started && ::waitpid(pid, &status, WNOHANG) == 0) {
      for (const std::string& e : entries()) started = started || e.rfind(".out.tmp.", 0) == 0;
      if (!started) ::usleep(200);
    }
    ASSERT_TRUE(started) << "the conversion ended before its temporary directory was seen";
    ::kill(pid, SIGINT);
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0) break;
    fs::remove_all(dir_ / "out");  // finished before the signal came: once more
  }
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_EQ(entries(), std::vector<std::string>{"hf"});
}

}  // namespace
}  // namespace grouplin
