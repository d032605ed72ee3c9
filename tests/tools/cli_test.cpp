// End-to-end tests of `grouplin inspect | convert | verify`: the built CLI runs in a child process
// on checkpoints generated here; exit codes, outputs and the files left behind are asserted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grouplin/checkpoint.hpp"
#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "grouplin/runtime.hpp"
#include "grouplin/safetensors.hpp"
#include "grouplin/version.hpp"
#include "io/moe_checkpoint.hpp"
#include "io/same_dict.hpp"
#include "temp_dir_test.hpp"
#include "tools/cli_runner.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using testing::expect_same_dict;
using testing::moe_state_dict;
using testing::MoeModuleSpec;

const std::vector<MoeModuleSpec> kModules = {
    {"model.layers.3.mlp.experts.", 4, 3, 5, true, DType::BF16},  // nested, bias
    {"model.layers.7.mlp.experts.", 1, 2, 6, false, DType::F32},  // N = 1, no bias
};

using test_files::read_all;

class CliTest : public test_files::TempDirTest {
 protected:
  CliTest() : TempDirTest("grouplin_cli") {}

  // Runs the CLI with `args` (see tools/cli_runner.hpp).
  CliRun run(const std::vector<std::string>& args) const { return run_cli(dir_, args); }

  // The files in the test folder (the CLI's temporary files would show here).
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
};

const char* ext(CheckpointFormat f) { return f == CheckpointFormat::Pt ? ".pt" : ".safetensors"; }

TEST_F(CliTest, ConvertsBothLayoutsBothFormats) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  for (CheckpointFormat in_format : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
    for (ExpertLayout from : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
      const std::string in = path(std::string("in") + ext(in_format));
      save_checkpoint(in, moe_state_dict(kModules, from), in_format, meta);
      for (CheckpointFormat out_format : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
        for (ExpertLayout to : {ExpertLayout::PerExpert, ExpertLayout::Single}) {
          const std::string layout(layout_name(to));
          SCOPED_TRACE(in + " " + std::string(layout_name(from)) + " -> " + layout +
                       ext(out_format));
          const std::string out = path(std::string("out") + ext(out_format));
          CliRun r = run({"convert", in, out, "--layout", layout});
          ASSERT_EQ(r.code, 0) << r.err;
          EXPECT_EQ(r.err, "");  // not a terminal: no progress bar
          EXPECT_NE(r.out.find("2 grouped module(s)"), std::string::npos) << r.out;
          const Checkpoint c = load_checkpoint(out);
          EXPECT_EQ(c.format, out_format);
          const StateDict want = moe_state_dict(kModules, to);
          EXPECT_EQ(c.tensors.size(), want.size());
          for (const auto& [name, t] : want) {
            const Tensor* got = c.tensors.find(name);
            ASSERT_NE(got, nullptr) << name;
            EXPECT_TRUE(t.bit_equal(*got)) << name;
          }
          if (in_format == CheckpointFormat::Safetensors && out_format == in_format) {
            EXPECT_EQ(c.metadata, meta);
          }
          CliRun v = run({"verify", in, out});
          EXPECT_EQ(v.code, 0) << v.out << v.err;
          fs::remove(out);
        }
      }
      fs::remove(in);
    }
  }
  EXPECT_TRUE(files().empty());
}

// A mistyped command or rule set name is named with the closest right one, exit 2.
TEST_F(CliTest, MistypedNamesSuggestTheRightOne) {
  CliRun r = run({"conver", "a", "b"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("grouplin: InvalidArgument: unknown command \"conver\"; did you mean "
                       "\"convert\"?"),
            std::string::npos)
      << r.err;
  r = run({"rules", "qwen3-moe"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("did you mean \"qwen3_moe\"?"), std::string::npos) << r.err;
  r = run({"frobnicate"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.find("did you mean"), std::string::npos) << r.err;  // nothing close
}

TEST_F(CliTest, FormatOptionWinsOverExtensionAndQuietIsSilent) {
  save_safetensors(path("in.safetensors"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  CliRun r = run({"convert", path("in.safetensors"), path("out.bin"), "--layout", "single",
                  "--format", "safetensors", "--quiet"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(detect_format(path("out.bin")), CheckpointFormat::Safetensors);
  // Without --format, .bin means PyTorch.
  r = run({"convert", path("in.safetensors"), path("out2.bin"), "--layout", "single"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(detect_format(path("out2.bin")), CheckpointFormat::Pt);
  // An extension that names no format, and no --format: refused.
  r = run({"convert", path("in.safetensors"), path("out.weights"), "--layout", "single"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--format"), std::string::npos);
  // An extension that names the other format: refused, nothing written.
  r = run({"convert", path("in.safetensors"), path("out3.safetensors"), "--layout", "single",
           "--format", "pt"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is named as a safetensors file, but the format asked for is pt"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("out3.safetensors")));
}

// Output paths do what their names say (docs/cli.md, "Output paths"): a directory of shards never
// replaces a file nor takes a file's name, and a file never replaces a directory.
TEST_F(CliTest, OutputPathsAreWhatTheirNamesSay) {
  save_safetensors(path("in.safetensors"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  CliRun r = run({"convert", path("in.safetensors"), path("shards.safetensors"), "--layout",
                  "single", "--max-shard-size", "1KB"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--max-shard-size writes a directory of shards"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("shards.safetensors")));
  // --force does not turn a regular file into a directory.
  std::ofstream(path("notes")) << "keep me";
  r = run({"convert", path("in.safetensors"), path("notes"), "--layout", "single",
           "--max-shard-size", "1KB", "--force"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("exists and is not a directory"), std::string::npos) << r.err;
  EXPECT_EQ(test_files::read_all(path("notes")), "keep me");
  // A file input into an existing directory: what would work is named.
  std::filesystem::create_directory(path("outdir"));
  r = run({"convert", path("in.safetensors"), path("outdir"), "--layout", "single", "--force"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("a file input converts to a file: name the file, e.g."), std::string::npos)
      << r.err;
  EXPECT_TRUE(std::filesystem::is_empty(path("outdir")));
}

// per-expert -> single -> per-expert gives back the very bytes GroupLin wrote.
TEST_F(CliTest, RoundTripIsByteIdentical) {
  const StateDict sd = moe_state_dict(kModules, ExpertLayout::PerExpert);
  for (CheckpointFormat f : {CheckpointFormat::Safetensors, CheckpointFormat::Pt}) {
    const std::string a = path(std::string("a") + ext(f)), b = path(std::string("b") + ext(f)),
                      c = path(std::string("c") + ext(f));
    save_checkpoint(a, sd, f, {{"k", "v"}});
    ASSERT_EQ(run({"convert", a, b, "--layout", "single"}).code, 0);
    ASSERT_EQ(run({"convert", b, c, "--layout", "per-expert"}).code, 0);
    EXPECT_EQ(read_all(a), read_all(c)) << ext(f);
  }
}

// TE names without _extra_state (kModules' second module has no bias either: a lone stacked
// weight in the single layout): every output of convert, file or directory, is found again
// without --rules, and per-expert -> single -> per-expert gives the direct per-expert output byte
// for byte. A .pt cannot declare the lone stack: convert warns, and converting that file back
// without --rules is refused rather than done as a no-op.
TEST_F(CliTest, WhatConvertWritesItRecognisesWithoutRules) {
  const StateDict sd = moe_state_dict(kModules, ExpertLayout::PerExpert, /*extras=*/false);
  save_safetensors(path("per.safetensors"), sd, {{"k", "v"}});
  ASSERT_EQ(run({"convert", path("per.safetensors"), path("direct.safetensors"), "--layout",
                 "per-expert"})
                .code,
            0);
  for (const char* single : {"single.safetensors", "single-dir"}) {
    SCOPED_TRACE(single);
    std::vector<std::string> args = {"convert", path("per.safetensors"), path(single), "--layout",
                                     "single"};
    if (std::string(single).ends_with("-dir")) args.insert(args.end(), {"--max-shard-size", "200"});
    CliRun r = run(args);
    ASSERT_EQ(r.code, 0) << r.err;
    r = run({"inspect", path(single), "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json doc = nlohmann::json::parse(r.out);
    ASSERT_EQ(doc["grouped_modules"].size(), 2u) << r.out;
    for (const auto& m : doc["grouped_modules"]) EXPECT_EQ(m["layout"], "single") << r.out;
    EXPECT_TRUE(doc["unconfirmed"].empty()) << r.out;
    EXPECT_EQ(run({"verify", path("per.safetensors"), path(single)}).code, 0);
    ASSERT_EQ(run({"convert", path(single), path("back.safetensors"), "--layout", "per-expert",
                   "--force"})
                  .code,
              0);
    EXPECT_EQ(read_all(path("back.safetensors")), read_all(path("direct.safetensors")));
    r = run({"convert", path(single), path("two.safetensors"), "--layout", "single", "--experts",
             "0:1", "--force"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(load_checkpoint(path("two.safetensors"))
                  .tensors.at("model.layers.3.mlp.experts.weight")
                  .dim(0),
              1);
  }
  CliRun r = run({"convert", path("per.safetensors"), path("single.pt"), "--layout", "single"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: NoGroupedModules"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.layers.7.mlp.experts."), std::string::npos) << r.err;
  // The module with a stacked bias is found; the lone stack passes as it is, with a warning.
  r = run({"convert", path("single.pt"), path("back.pt"), "--layout", "per-expert"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: NoGroupedModules: \"model.layers.7.mlp.experts.weight\" left as "
                       "it is"),
            std::string::npos)
      << r.err;
  r = run({"inspect", path("single.pt")});
  EXPECT_NE(r.out.find("not taken for grouped modules"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.layers.7.mlp.experts.weight [1, 2, 6]"), std::string::npos) << r.out;
  EXPECT_EQ(run({"verify", path("per.safetensors"), path("single.pt"), "--rules", "te"}).code, 0);
}

TEST_F(CliTest, BadInputsExitTwoAndLeaveNoOutput) {
  const StateDict sd = moe_state_dict(kModules, ExpertLayout::PerExpert);
  save_safetensors(path("good.safetensors"), sd);
  save_pt(path("good.pt"), sd);
  const std::string good = read_all(path("good.safetensors"));
  std::ofstream(path("truncated.safetensors"), std::ios::binary) << good.substr(0, good.size() - 9);
  // Cut inside the header: a safetensors file cut short, as its header length tells.
  std::ofstream(path("cut.safetensors"), std::ios::binary) << good.substr(0, 40);
  const std::string good_pt = read_all(path("good.pt"));
  std::ofstream(path("truncated.pt"), std::ios::binary) << good_pt.substr(0, good_pt.size() - 30);
  StateDict partial = sd;
  partial.erase("model.layers.3.mlp.experts.weight2");
  save_pt(path("partial.pt"), partial);
  StateDict mixed = sd;
  mixed.insert("model.layers.3.mlp.experts.weight", Tensor::zeros({4, 3, 5}, DType::BF16));
  save_safetensors(path("mixed.safetensors"), mixed);
  std::ofstream(path("unknown.bin"), std::ios::binary) << "GGUF\3\0\0\0 some other format";
  fs::create_directory(path("folder"));
  const std::vector<std::string> inputs_before = files();

  const std::pair<std::string, std::string> cases[] = {
      {"missing.safetensors", "No such file"},
      {"folder", "no *.safetensors file"},
      {"truncated.safetensors", "Truncated"},
      {"truncated.pt", "truncated.pt"},
      {"cut.safetensors", "cut short"},
      {"partial.pt", "PartialExpertSet"},
      {"mixed.safetensors", "BothLayoutsPresent"},
      {"unknown.bin", "UnknownFormat"},
  };
  for (const auto& [name, message] : cases) {
    for (const char* out : {"out.safetensors", "out.pt"}) {
      CliRun r = run({"convert", path(name), path(out), "--layout", "single"});
      EXPECT_EQ(r.code, 2) << name;
      EXPECT_NE(r.err.find(message), std::string::npos) << name << ": " << r.err;
      EXPECT_NE(r.err.find(name), std::string::npos) << "the message names the file: " << r.err;
      EXPECT_EQ(files(), inputs_before) << name << " -> " << out;
    }
    CliRun v = run({"verify", path(name), path("good.pt")});
    EXPECT_EQ(v.code, 2) << name << v.out;
    CliRun i = run({"inspect", path(name)});
    EXPECT_EQ(i.code, 2) << name;
  }
  // The partial expert set names the module prefix and the missing expert.
  CliRun r = run({"convert", path("partial.pt"), path("out.pt"), "--layout", "single"});
  EXPECT_NE(r.err.find("\"model.layers.3.mlp.experts.\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("weight2"), std::string::npos) << r.err;
}

TEST_F(CliTest, RefusesExistingOutAndIn) {
  save_pt(path("in.pt"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  const std::string in_bytes = read_all(path("in.pt"));
  std::ofstream(path("out.pt")) << "keep me";

  CliRun r = run({"convert", path("in.pt"), path("out.pt"), "--layout", "single"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(read_all(path("out.pt")), "keep me");

  for (const std::string& same : {path("in.pt"), (dir_ / "." / "in.pt").string()}) {
    r = run({"convert", path("in.pt"), same, "--layout", "single", "--force"});
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  }
  EXPECT_EQ(read_all(path("in.pt")), in_bytes);

  r = run({"convert", path("in.pt"), path("out.pt"), "--layout", "single", "--force"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(run({"verify", path("in.pt"), path("out.pt")}).code, 0);
  EXPECT_EQ((std::vector<std::string>{"in.pt", "out.pt"}), files());
}

// No --layout (or --layout keep): the modules' own layout, for a change of format, sharding,
// dtype or experts; nothing to change at all is an error, and so are modules in both layouts.
TEST_F(CliTest, KeepingTheLayoutChangesOnlyWhatWasAskedFor) {
  const StateDict per_expert = moe_state_dict(kModules, ExpertLayout::PerExpert);
  save_pt(path("in.pt"), per_expert);
  CliRun r = run({"convert", path("in.pt"), path("out.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("layout kept (per-expert)"), std::string::npos) << r.out;
  expect_same_dict(load_safetensors(path("out.safetensors")).tensors, per_expert);
  r = run({"convert", path("in.pt"), path("again.pt"), "--layout", "keep"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("grouplin: NothingToChange: ", 0), 0u) << r.err;
  EXPECT_FALSE(fs::exists(path("again.pt")));
  const StateDict single = moe_state_dict(kModules, ExpertLayout::Single);
  save_pt(path("single.pt"), single);
  r = run({"convert", path("single.pt"), path("single.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("layout kept (single)"), std::string::npos) << r.out;
  expect_same_dict(load_safetensors(path("single.safetensors")).tensors, single);
  // One module per-expert, one single: which to keep is not one answer.
  StateDict mixed;
  for (const StateDict* d : {&per_expert, &single}) {
    const std::string keep = d == &single ? "model.layers.7." : "model.layers.3.";
    for (const auto& [name, t] : *d) {
      if (name.rfind(keep, 0) == 0) mixed.insert(name, t);
    }
  }
  save_pt(path("mixed.pt"), mixed);
  r = run({"convert", path("mixed.pt"), path("mixed.safetensors")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("name the layout of the output"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("mixed.safetensors")));
}

// One result document per command under --json, an error document for what cannot be read;
// inspect takes several paths and goes on past a bad one; --modules leaves out the tensor list.
TEST_F(CliTest, JsonDocumentsAndSeveralPaths) {
  save_pt(path("in.pt"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  std::ofstream(path("bad.safetensors")) << "GGUF....";
  CliRun r = run({"inspect", path("in.pt"), path("bad.safetensors"), path("in.pt"), "--json"});
  EXPECT_EQ(r.code, 2);
  nlohmann::json docs = nlohmann::json::parse(r.out);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0]["grouped_modules"].size(), 2u);
  EXPECT_EQ(docs[1]["file"], path("bad.safetensors"));
  EXPECT_EQ(docs[1]["error"]["code"], "UnknownFormat");
  EXPECT_EQ(docs[2], docs[0]);
  EXPECT_NE(r.err.find("GGUF"), std::string::npos) << r.err;

  r = run({"inspect", path("bad.safetensors"), "--json"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(nlohmann::json::parse(r.out)["error"]["code"], "UnknownFormat");

  r = run({"inspect", path("in.pt"), path("in.pt"), "--modules"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("model.layers.3.mlp.experts.weight0"), std::string::npos) << r.out;
  size_t listings = 0;
  for (size_t at = r.out.find("tensors: "); at != std::string::npos;
       at = r.out.find("tensors: ", at + 1)) {
    ++listings;
  }
  EXPECT_EQ(listings, 2u) << r.out;

  r = run({"convert", path("in.pt"), path("out.safetensors"), "--layout", "single", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["output"], path("out.safetensors"));
  EXPECT_EQ(report["layout"], "single");
  EXPECT_EQ(report["grouped_modules"], 2);
  EXPECT_EQ(report["modules"][1]["prefix"], "model.layers.7.mlp.experts.");
  EXPECT_EQ(report["output_files"], nlohmann::json::array({"out.safetensors"}));
  r = run({"convert", path("in.pt"), path("out.safetensors"), "--json"});  // exists
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(nlohmann::json::parse(r.out)["input"], path("in.pt"));

  r = run({"verify", path("in.pt"), path("out.safetensors"), "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["same"], true);
  save_pt(path("other.pt"), moe_state_dict(kModules, ExpertLayout::PerExpert, /*extras=*/false));
  r = run({"verify", path("in.pt"), path("other.pt"), "--json"});
  EXPECT_EQ(r.code, 1);
  const nlohmann::json v = nlohmann::json::parse(r.out);
  EXPECT_EQ(v["same"], false);
  EXPECT_GT(v["differing"].get<int>(), 0);
}

// At a terminal: convert's bar says when it is flushing to disk, verify has a bar too.
TEST_F(CliTest, ProgressBarsAtATerminal) {
  save_pt(path("in.pt"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  CliRun r = run_cli_on_terminal(dir_, {"convert", path("in.pt"), path("out.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("converting ["), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("flushing to disk..."), std::string::npos) << r.err;
  r = run_cli_on_terminal(dir_, {"verify", path("in.pt"), path("out.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("verifying ["), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("100%"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("same: "), std::string::npos) << r.out;
}

TEST_F(CliTest, BadUsageExitsTwo) {
  save_pt(path("in.pt"), moe_state_dict(kModules, ExpertLayout::PerExpert));
  // Every usage error in GroupLin's form, naming the help to read.
  CliRun r = run({"convert", path("in.pt"), path("o.pt"), "--layout", "stacked"});
  EXPECT_EQ(r.err.rfind("grouplin: InvalidArgument: --layout: stacked not in ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("(grouplin convert --help)"), std::string::npos) << r.err;
  r = run({"verify", path("in.pt")});
  EXPECT_EQ(r.err.rfind("grouplin: InvalidArgument: ", 0), 0u) << r.err;
  EXPECT_EQ(run({"convert", path("in.pt"), path("o.pt"), "--layout", "stacked"}).code, 2);
  EXPECT_EQ(
      run({"convert", path("in.pt"), path("o.pt"), "--layout", "single", "--format", "gguf"}).code,
      2);
  EXPECT_EQ(run({"verify", path("in.pt")}).code, 2);
  EXPECT_EQ(run({"inspect"}).code, 2);
  EXPECT_EQ(run({"frobnicate"}).code, 2);
  EXPECT_FALSE(fs::exists(path("o.pt")));
  // A missing output folder is named as the folder, not through a temporary file's name.
  r = run({"convert", path("in.pt"), path("no/such/o.safetensors")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("its folder \"" + path("no/such") + "\" does not exist"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find(".tmp"), std::string::npos) << r.err;
}

TEST_F(CliTest, HelpOnEveryCommand) {
  for (const char* cmd : {"inspect", "convert", "verify", "demo", "bench"}) {
    CliRun r = run({cmd, "--help"});
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("Examples:"), std::string::npos) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find(std::string("Usage: grouplin ") + cmd), std::string::npos) << r.out;
    // Placeholders, not CLI11's type names nor the binary's path.
    for (const char* noise : {"TEXT", "UINT", ":INT", ":{", "/grouplin "}) {
      EXPECT_EQ(r.out.find(noise), std::string::npos) << cmd << " help has " << noise << r.out;
    }
  }
  CliRun r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* cmd : {"inspect", "convert", "verify"})
    EXPECT_NE(r.out.find(cmd), std::string::npos);
  r = run({"--version"});  // the library's own version, not a copy of it
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "grouplin " + std::string(version()));
  EXPECT_NE(r.out.find("\nkernels: " + kernel_isa() + " (cpu: "), std::string::npos) << r.out;
  // GROUPLIN_ISA caps the kernels, and a bad value is a named error.
  r = run_cli(dir_, {"--version"}, {"GROUPLIN_ISA=portable"});
  EXPECT_NE(r.out.find("\nkernels: portable (cpu: "), std::string::npos) << r.out;
  r = run_cli(dir_, {"--version"}, {"GROUPLIN_ISA=avx9"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("InvalidEnvironment: environment variable GROUPLIN_ISA=\"avx9\""),
            std::string::npos)
      << r.err;
}

// Regression: with a bad GROUPLIN_ISA, `grouplin demo` printed its first lines before failing
// at its first kernel call. Every command now reads the kernels' environment at startup: one
// error, exit 2, nothing on stdout.
TEST_F(CliTest, ABadKernelEnvironmentIsOneErrorAtStartup) {
  const std::string isa_error =
      "grouplin: InvalidEnvironment: environment variable GROUPLIN_ISA=\"bogus\": expected one of "
      "portable, avx2, avx512, avx512bf16, amx\n";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"demo"}, {"bench", "--quick"}, {"inspect", path("none.pt")}}) {
    SCOPED_TRACE(args[0]);
    const CliRun r = run_cli(dir_, args, {"GROUPLIN_ISA=bogus"});
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, isa_error);
  }
  CliRun r = run_cli(dir_, {"demo"}, {"GROUPLIN_NUM_THREADS=0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("InvalidEnvironment: environment variable GROUPLIN_NUM_THREADS=\"0\""),
            std::string::npos)
      << r.err;
  // --version says it too, and help still answers.
  r = run_cli(dir_, {"--version"}, {"GROUPLIN_ISA=bogus"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "grouplin " + std::string(version()));
  EXPECT_NE(r.out.find("\nkernels: none (cpu: "), std::string::npos) << r.out;
  EXPECT_EQ(r.err, isa_error);
  r = run_cli(dir_, {"demo", "--help"}, {"GROUPLIN_ISA=bogus"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CliTest, VerifyExitCodes) {
  StateDict a = moe_state_dict(kModules, ExpertLayout::PerExpert);
  save_safetensors(path("a.safetensors"), a);
  save_pt(path("a_single.pt"), moe_state_dict(kModules, ExpertLayout::Single));
  CliRun r = run({"verify", path("a.safetensors"), path("a_single.pt")});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("same:"), std::string::npos) << r.out;

  StateDict b = a;
  Tensor w = b.at("model.layers.3.mlp.experts.weight1").clone();
  w.mutable_data_as<uint16_t>()[6] ^= 0x8000;  // flip the sign of element [1, 1]
  b.set("model.layers.3.mlp.experts.weight1", w);
  save_safetensors(path("b.safetensors"), b);
  r = run({"verify", path("a_single.pt"), path("b.safetensors")});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("\"model.layers.3.mlp.experts.weight1\": 1 of 15 elements differ, first at "
                       "[1, 1]"),
            std::string::npos)
      << r.out;

  StateDict c = a;
  c.erase("step");
  save_safetensors(path("c.safetensors"), c);
  r = run({"verify", path("a.safetensors"), path("c.safetensors")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("\"step\": only in A"), std::string::npos) << r.out;

  r = run({"verify", path("a.safetensors"), path("nothing.pt")});
  EXPECT_EQ(r.code, 2);
}

TEST_F(CliTest, InspectTextAndJson) {
  save_safetensors(path("m.safetensors"), moe_state_dict(kModules, ExpertLayout::Single),
                   {{"format", "pt"}});
  CliRun r = run({"inspect", path("m.safetensors")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model.layers.3.mlp.experts.weight"), std::string::npos);
  EXPECT_NE(r.out.find("[4, 3, 5]"), std::string::npos);
  EXPECT_NE(r.out.find("single"), std::string::npos);

  r = run({"inspect", path("m.safetensors"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["format"], "safetensors");
  EXPECT_EQ(doc["file_bytes"], fs::file_size(path("m.safetensors")));
  EXPECT_EQ(doc["metadata"]["format"], "pt");
  const StateDict sd = moe_state_dict(kModules, ExpertLayout::Single);
  ASSERT_EQ(doc["tensors"].size(), sd.size());
  uint64_t total = 0;
  for (const auto& t : doc["tensors"]) {
    const Tensor& want = sd.at(t["name"].get<std::string>());
    EXPECT_EQ(t["dtype"], std::string(dtype_name(want.dtype())));
    EXPECT_EQ(t["shape"].get<Shape>(), want.shape());
    EXPECT_EQ(t["bytes"], want.nbytes());
    total += want.nbytes();
  }
  // Modules in file order: safetensors data is sorted by dtype size then name, F32 first.
  ASSERT_EQ(doc["grouped_modules"].size(), 2u);
  EXPECT_EQ(doc["grouped_modules"][0]["prefix"], "model.layers.7.mlp.experts.");
  const auto& m = doc["grouped_modules"][1];
  EXPECT_EQ(m["prefix"], "model.layers.3.mlp.experts.");
  EXPECT_EQ(m["layout"], "single");
  EXPECT_EQ(m["num_experts"], 4);
  EXPECT_EQ(m["out_features"], 3);
  EXPECT_EQ(m["in_features"], 5);
  EXPECT_EQ(m["bias"], true);
  EXPECT_EQ(m["dtype"], "BF16");
  EXPECT_EQ(m["bias_dtype"], "BF16");
  EXPECT_EQ(m["keys"], (std::vector<std::string>{"model.layers.3.mlp.experts.bias",  // file order
                                                 "model.layers.3.mlp.experts.weight"}));
  EXPECT_EQ(doc["grouped_modules"][0]["bias"], false);
  EXPECT_TRUE(doc["grouped_modules"][0]["bias_dtype"].is_null());
  EXPECT_TRUE(doc["problems"].empty());
  EXPECT_EQ(doc["totals"]["tensors"], sd.size());
  EXPECT_EQ(doc["totals"]["tensor_bytes"], total);
  EXPECT_EQ(doc["totals"]["grouped_modules"], 2);
  EXPECT_EQ(doc["totals"]["experts"], 5);

  StateDict partial = moe_state_dict(kModules, ExpertLayout::PerExpert);
  partial.erase("model.layers.3.mlp.experts.bias0");
  save_pt(path("partial.pt"), partial);
  r = run({"inspect", path("partial.pt"), "--json"});
  EXPECT_EQ(r.code, 2);
  const nlohmann::json bad = nlohmann::json::parse(r.out);  // still a whole document
  ASSERT_EQ(bad["problems"].size(), 1u);
  EXPECT_EQ(bad["problems"][0]["code"], "PartialExpertSet");
  EXPECT_EQ(bad["grouped_modules"].size(), 1u);
}

// Regression: names from a file reached the terminal raw. A tensor or module named with escape
// sequences could clear the screen, retitle the window or hide text in `inspect`, `verify` and
// error messages; every listing and message now shows them escaped.
TEST_F(CliTest, NamesFromTheFileArePrintedEscaped) {
  const std::string evil = "x\x1b[2J\x1b]0;owned\x07";
  StateDict d =
      moe_state_dict({{evil + ".experts.", 2, 3, 4, true, DType::F32}}, ExpertLayout::PerExpert);
  d.insert("note\x1b[31m\xe2\x80\xae", Tensor::zeros({1}, DType::I8));
  save_safetensors(path("e.safetensors"), d, {{"k\x1b[1m", "v\xc2\x9b\x07"}});
  save_pt(path("e.pt"), d);
  auto no_raw_controls = [](const std::string& text) {
    for (char c : text) {
      if (c == '\x1b' || c == '\x07' || c == '\x9b') return false;
    }
    return text.find("\xe2\x80\xae") == std::string::npos;
  };
  for (const char* file : {"e.safetensors", "e.pt"}) {
    CliRun r = run({"inspect", path(file)});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(no_raw_controls(r.out)) << r.out;
    EXPECT_NE(r.out.find("x\\x1b[2J\\x1b]0;owned\\x07.experts.weight0"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("note\\x1b[31m\\u202e"), std::string::npos) << r.out;

    r = run({"inspect", path(file), "--json"});  // JSON escapes controls itself; names exact
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(no_raw_controls(r.out));
    const nlohmann::json doc = nlohmann::json::parse(r.out);
    EXPECT_EQ(doc["grouped_modules"][0]["prefix"], evil + ".experts.");
  }
  CliRun r = run({"inspect", path("e.safetensors")});
  EXPECT_NE(r.out.find("k\\x1b[1m = v\\u009b\\x07"), std::string::npos) << r.out;

  // verify lists differing names, and convert's error messages name entries: both escaped.
  StateDict other = d;
  other.erase("note\x1b[31m\xe2\x80\xae");
  save_safetensors(path("f.safetensors"), other);
  r = run({"verify", path("e.pt"), path("f.safetensors")});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(no_raw_controls(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"note\\x1b[31m\\u202e\": only in A"), std::string::npos) << r.out;

  StateDict partial = d;
  partial.erase(evil + ".experts.bias1");
  save_safetensors(path("p.safetensors"), partial);
  r = run({"convert", path("p.safetensors"), path("out.safetensors"), "--layout", "single"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(no_raw_controls(r.err)) << r.err;
  EXPECT_NE(r.err.find("\\x1b[2J"), std::string::npos) << r.err;
}

// The .pt files convert writes (records copied inside the kernel, CRC-32 computed on a second
// thread) load in PyTorch 1.13 with torch.load(weights_only=True), with the expected values.
TEST_F(CliTest, TorchLoadsConvertedFiles) {
  for (ExpertLayout to : {ExpertLayout::Single, ExpertLayout::PerExpert}) {
    const ExpertLayout from =
        to == ExpertLayout::Single ? ExpertLayout::PerExpert : ExpertLayout::Single;
    save_pt(path("in.pt"), moe_state_dict(kModules, from));
    const std::string layout(layout_name(to));
    ASSERT_EQ(run({"convert", path("in.pt"), path("out.pt"), "--layout", layout, "--force"}).code,
              0);
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& [name, t] : moe_state_dict(kModules, to)) {
      std::string hex;
      for (size_t i = 0; i < t.nbytes(); ++i) {
        char b[3];
        std::snprintf(b, sizeof b, "%02x", std::to_integer<unsigned>(t.data()[i]));
        hex += b;
      }
      tensors.push_back({{"name", name},
                         {"dtype", std::string(dtype_name(t.dtype()))},
                         {"shape", t.shape()},
                         {"hex", hex}});
    }
    std::ofstream(path("want.json")) << nlohmann::json{{"tensors", tensors}}.dump();
    const std::string cmd = std::string("'") + GROUPLIN_PYTHON + "' '" + GROUPLIN_SOURCE_DIR +
                            "/tests/io/pt_peer.py' check '" + path("out.pt") + "' '" +
                            path("want.json") + "' > '" + path("peer.log") + "' 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0)
        << layout << ": " << read_all(path("peer.log"));
  }
}

// Memory stays bounded: a 256 MiB checkpoint of 1 MiB experts converts with a peak resident set
// far below the file size, both directions and both output formats. ru_maxrss counts file pages
// mapped into the process too, so this is stricter than the RssAnon contract; the converter never
// touches tensor pages of its mapping (it copies with copy_file_range or pread).
TEST_F(CliTest, ConvertMemoryStaysBounded) {
  if (kUnderAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine blur resident-set figures";
  }
  constexpr int64_t kExperts = 64, kLayers = 4, kOut = 512, kIn = 512;  // F32: 1 MiB per expert
  std::vector<MoeModuleSpec> modules;
  for (int64_t l = 0; l < kLayers; ++l) {
    modules.push_back({"model.layers." + std::to_string(l) + ".mlp.experts.", kExperts, kOut, kIn,
                       false, DType::F32});
  }
  // Built in a child process: a child of this process starts from this process's peak RSS
  // (ru_maxrss carries over fork and exec), so the 256 MiB dict must never live here.
  const pid_t maker = ::fork();
  ASSERT_GE(maker, 0);
  if (maker == 0) {
    save_safetensors(path("big.safetensors"),
                     moe_state_dict(modules, ExpertLayout::PerExpert, false));
    ::_exit(0);
  }
  int maker_status = 0;
  ASSERT_EQ(::waitpid(maker, &maker_status, 0), maker);
  ASSERT_TRUE(WIFEXITED(maker_status) && WEXITSTATUS(maker_status) == 0);
  const uint64_t file_kib = fs::file_size(path("big.safetensors")) / 1024;
  ASSERT_GT(file_kib, 256u * 1024);
  // Largest output tensor: 64 MiB (one stacked layer), which the converter never holds either.
  const long limit_kib = 48 * 1024;
  struct Step {
    const char* in;
    const char* out;
    const char* layout;
  };
  for (const Step& s : {Step{"big.safetensors", "single.safetensors", "single"},
                        Step{"single.safetensors", "back.pt", "per-expert"},
                        Step{"back.pt", "single.pt", "single"}}) {
    // No _extra_state beside the stacked weights: te is named (a lone rank-3 "P.weight" is no
    // module to the detected rules).
    CliRun r =
        run({"convert", path(s.in), path(s.out), "--layout", s.layout, "--quiet", "--rules", "te"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_LT(r.max_rss_kib, limit_kib) << s.in << " -> " << s.out << ": peak RSS " << r.max_rss_kib
                                        << " KiB for a file of " << file_kib << " KiB";
  }
  // And the values made it through. (verify reads .pt records through the mapping for their
  // CRC-32: file pages, which count in ru_maxrss, so its memory is not asserted here.)
  for (const char* out : {"single.safetensors", "back.pt", "single.pt"}) {
    CliRun v = run({"verify", path("big.safetensors"), path(out), "--rules", "te"});
    EXPECT_EQ(v.code, 0) << out << ": " << v.out;
  }
  CliRun v = run({"verify", path("big.safetensors"), path("single.safetensors"), "--rules", "te"});
  EXPECT_LT(v.max_rss_kib, limit_kib) << "verify of two safetensors files reads with pread only";
}

// Tensors the .pt reader had to copy into memory (a non-contiguous expert, as torch.save writes
// a transposed view) are converted from memory, in their row-major order.
TEST_F(CliTest, ConvertsNonContiguousExperts) {
  const std::string script =
      "import torch, sys\n"
      "w = [torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * i for i in range(3)]\n"
      "e = torch.zeros(0, dtype=torch.uint8)\n"
      "sd = {'m.weight0': w[0], 'm.weight1': w[1].t().contiguous().t(), 'm.weight2': w[2],\n"
      "      'm._extra_state': e}\n"
      "assert not sd['m.weight1'].is_contiguous()\n"
      "torch.save(sd, sys.argv[1])\n"
      "torch.save({'m.weight': torch.stack(w), 'm._extra_state': e}, sys.argv[2])\n";
  std::ofstream(path("make.py")) << script;
  const std::string cmd = std::string("'") + GROUPLIN_PYTHON + "' '" + path("make.py") + "' '" +
                          path("in.pt") + "' '" + path("want.pt") + "' > '" + path("py.log") +
                          "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_all(path("py.log"));
  CliRun r = run({"convert", path("in.pt"), path("out.safetensors"), "--layout", "single"});
  ASSERT_EQ(r.code, 0) << r.err;
  r = run({"verify", path("out.safetensors"), path("want.pt")});
  EXPECT_EQ(r.code, 0) << r.out;
  r = run({"verify", path("in.pt"), path("want.pt")});
  EXPECT_EQ(r.code, 0) << r.out;
}

// Ctrl-C or SIGTERM midway: the CLI stops at its next progress point, says it was interrupted
// (Error code Interrupted, not IoError), exits 128 + the signal as interrupted tools do (130,
// 143), and leaves neither OUT nor its temporary file. The signal is sent once the temporary
// file exists, so the handler is in place; should the machine be so slow that the conversion
// (128 MiB) ends before the signal lands, the run is repeated.
TEST_F(CliTest, InterruptSaysSoExits128PlusSignalAndLeavesNothing) {
  std::vector<MoeModuleSpec> modules;
  for (int l = 0; l < 2; ++l) {
    modules.push_back(
        {"layers." + std::to_string(l) + ".experts.", 64, 512, 512, true, DType::F32});
  }
  const std::string in = path("single.safetensors");
  const std::string out = path("interrupted.pt");
  save_safetensors(in, moe_state_dict(modules, ExpertLayout::Single, false));
  const std::string err_file = path(".stderr");
  for (const int signal : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(signal == SIGINT ? "SIGINT" : "SIGTERM");
    int status = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        const int devnull = ::open("/dev/null", O_WRONLY);
        const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(devnull, 1);
        ::dup2(err, 2);
        ::execl(GROUPLIN_CLI, GROUPLIN_CLI, "convert", in.c_str(), out.c_str(), "--layout",
                "per-expert", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      // Wait for the temporary file (the signal handler is installed before it is created).
      bool started = false;
      while (!started && ::waitpid(pid, &status, WNOHANG) == 0) {
        for (const std::string& f : files())
          started = started || f.find(".tmp.") != std::string::npos;
        if (!started) ::usleep(200);
      }
      ASSERT_TRUE(started) << "the conversion ended before its temporary file was seen: "
                           << read_all(err_file);
      ::kill(pid, signal);
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
      if (WEXITSTATUS(status) != 0) break;
      fs::remove(out);  // finished before the signal came: once more
    }
    EXPECT_EQ(WEXITSTATUS(status), 128 + signal);
    const std::string err = read_all(err_file);
    fs::remove(err_file);
    const std::string want = "grouplin: Interrupted: converting " + grouplin::quote(in) +
                             ": interrupted by " +
                             (signal == SIGINT ? "SIGINT (Ctrl-C)" : "SIGTERM") + " after ";
    EXPECT_EQ(err.rfind(want, 0), 0u) << err;
    EXPECT_NE(err.find(" of 134.5 MB of tensor data; the output " + grouplin::quote(out) +
                       " was not written\n"),
              std::string::npos)
        << err;
    EXPECT_EQ(files(), std::vector<std::string>{"single.safetensors"});
  }
}

}  // namespace
}  // namespace grouplin
