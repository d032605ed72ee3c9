// The README's command-line walk-through and the examples of docs/cli.md marked "replayed by
// tests/tools/readme_test.cpp", replayed as printed: moe.pt written by torch.save
// (tests/tools/readme_moe.py), every `$ ` command run by the shell with the built `grouplin` first
// on PATH, and its output compared with the document's line by line. Sizes, byte counts, times and
// rates are masked (a .pt file's size depends on the PyTorch that wrote it); a README line "..."
// stands for any number of lines. A command must exit 0 (the README shows
// the others' exit codes with `echo "exit $?"`, which the comparison then covers).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

using test_files::read_all;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  while (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

// A line with what may differ between runs masked: rates, times, sizes with a unit and byte
// counts. Every other character, counts and exit codes included, is compared as printed.
std::string masked(const std::string& line) {
  static const std::regex rate(R"(\([0-9.]+ [kMGT]?B/s\))");
  static const std::regex time(R"(in [0-9.]+ s)");
  static const std::regex size(R"([0-9.]+ [kMGT]?B\b)");
  static const std::regex bytes(R"(\([0-9]+ bytes\))");
  std::string out = std::regex_replace(line, rate, "(RATE)");
  out = std::regex_replace(out, time, "in TIME s");
  out = std::regex_replace(out, size, "SIZE");
  return std::regex_replace(out, bytes, "(BYTES)");
}

struct Step {
  std::string command;
  std::vector<std::string> expected;
};

// The steps of the block that follows `intro` in `readme`, appended to `steps`; false when there
// is no such block.
bool add_block(const std::string& readme, size_t at, std::vector<Step>& steps) {
  const size_t open = readme.find("```\n", at);
  const size_t close = readme.find("\n```", open + 4);
  if (open == std::string::npos || close == std::string::npos) return false;
  const size_t first = steps.size();
  for (const std::string& line : lines_of(readme.substr(open + 4, close - open - 4))) {
    if (line.starts_with("$ ")) {
      steps.push_back({line.substr(2), {}});
    } else if (steps.size() > first) {
      steps.back().expected.push_back(line);
    }
  }
  for (size_t i = first; i < steps.size(); ++i) {
    while (!steps[i].expected.empty() && steps[i].expected.back().empty()) {
      steps[i].expected.pop_back();
    }
  }
  return true;
}

// The steps of the block that follows `intro` (its first occurrence, or every one when `all`).
std::vector<Step> walkthrough(const std::string& readme, const std::string& intro,
                              bool all = false) {
  std::vector<Step> steps;
  for (size_t at = readme.find(intro); at != std::string::npos;
       at = all ? readme.find(intro, at + 1) : std::string::npos) {
    add_block(readme, at, steps);
  }
  return steps;
}

// Whether `got` matches `want` line by line (masked), a want line "..." taking any number of
// lines; on a mismatch `why` says where.
bool matches(const std::vector<std::string>& want, size_t w, const std::vector<std::string>& got,
             size_t g, std::string& why) {
  for (; w < want.size(); ++w, ++g) {
    if (want[w] == "  ..." || want[w] == "...") {
      for (size_t skip = g; skip <= got.size(); ++skip) {
        if (matches(want, w + 1, got, skip, why)) return true;
      }
      return false;
    }
    if (g >= got.size()) {
      why = "missing line " + std::to_string(w + 1) + ": " + want[w];
      return false;
    }
    if (masked(want[w]) != masked(got[g])) {
      why = "line " + std::to_string(g + 1) + "\n  document: " + want[w] + "\n  got:    " + got[g];
      return false;
    }
  }
  if (g != got.size()) {
    why = "extra line " + std::to_string(g + 1) + ": " + got[g];
    return false;
  }
  return true;
}

class ReadmeTest : public test_files::TempDirTest {
 protected:
  ReadmeTest() : TempDirTest("grouplin_readme") {}

  // Runs `steps` in the scratch folder, each as the shell would, and compares their output.
  void replay(const std::vector<Step>& steps) {
    const std::string bin = std::filesystem::path(GROUPLIN_CLI).parent_path().string();
    std::ofstream(path("run.sh")) << "cd \"$1\" && PATH=\"$2:$PATH\" && eval \"$3\"\n";
    for (const Step& s : steps) {
      SCOPED_TRACE(s.command);
      std::ofstream(path("command.txt")) << s.command;
      const std::string cmd = "bash '" + path("run.sh") + "' '" + dir_.string() + "' '" + bin +
                              "' \"$(cat '" + path("command.txt") + "')\" > '" + path("out.txt") +
                              "' 2>&1";
      const int status = std::system(cmd.c_str());
      const std::string out = read_all(path("out.txt"));
      EXPECT_EQ(status, 0) << out;
      std::string why;
      EXPECT_TRUE(matches(s.expected, 0, lines_of(out), 0, why)) << why << "\n--- output:\n" << out;
    }
  }

  // moe.pt as tests/tools/readme_moe.py writes it with torch.save.
  void make_moe_pt() {
    const std::filesystem::path source = GROUPLIN_SOURCE_DIR;
    ASSERT_EQ(std::system("command -v jq >/dev/null"), 0) << "jq (Debian package jq) is needed";
    const std::string make = std::string("'") + GROUPLIN_PYTHON + "' '" +
                             (source / "tests/tools/readme_moe.py").string() + "' '" +
                             path("moe.pt") + "' > '" + path("py.log") + "' 2>&1";
    ASSERT_EQ(std::system(make.c_str()), 0) << read_all(path("py.log"));
  }
};

TEST_F(ReadmeTest, CommandLineWalkthroughRunsAsPrinted) {
  const std::filesystem::path source = GROUPLIN_SOURCE_DIR;
  const std::vector<Step> steps =
      walkthrough(read_all(source / "README.md"),
                  "A full conversion session on a PyTorch checkpoint of per-expert weights");
  ASSERT_GE(steps.size(), 8u) << "the README's walk-through was not found";
  make_moe_pt();
  replay(steps);
}

// docs/cli.md's examples marked as replayed, in order, in one folder: moe.pt as in the README,
// and Megatron-LM's checkpoint of two model chunks as torch.save wrote it
// (tests/io/real_writers/torch2_15_megatron_vp.pt) under the name Megatron gives it.
TEST_F(ReadmeTest, CliDocExamplesRunAsPrinted) {
  const std::filesystem::path source = GROUPLIN_SOURCE_DIR;
  const std::vector<Step> steps =
      walkthrough(read_all(source / "docs/cli.md"),
                  "<!-- replayed by tests/tools/readme_test.cpp -->", /*all=*/true);
  ASSERT_GE(steps.size(), 10u) << "docs/cli.md's replayed examples were not found";
  make_moe_pt();
  std::filesystem::copy_file(source / "tests/io/real_writers/torch2_15_megatron_vp.pt",
                             path("model_optim_rng.pt"));
  replay(steps);
}

}  // namespace
}  // namespace grouplin
