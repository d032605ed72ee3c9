// Interoperability with real PyTorch (the .venv peer, tests/io/pt_peer.py), both directions:
// files torch.save writes load here with identical bytes, and files GroupLin writes load in
// torch.load(weights_only=True) with identical values. A failing peer fails the test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct PeerRun {
  int status = -1;
  std::string output;
};

PeerRun run_peer(const std::string& args, const fs::path& dir) {
  const fs::path log = dir / "peer.log";
  const std::string cmd = std::string("'") + GROUPLIN_PYTHON + "' '" + GROUPLIN_SOURCE_DIR +
                          "/tests/io/pt_peer.py' " + args + " > '" + log.string() + "' 2>&1";
  int rc = std::system(cmd.c_str());
  PeerRun r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

std::string hex(const Tensor& t) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    auto b = std::to_integer<unsigned>(t.data()[i]);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void write_manifest(const fs::path& p, const StateDict& sd, json extra) {
  json tensors = json::array();
  for (const auto& [name, t] : sd) {
    tensors.push_back({{"name", name},
                       {"dtype", std::string(dtype_name(t.dtype()))},
                       {"shape", t.shape()},
                       {"hex", hex(t)}});
  }
  extra["tensors"] = tensors;
  std::ofstream(p) << extra.dump();
}

// The dict matches a manifest: names in order, dtypes, shapes, bytes.
void expect_matches(const StateDict& sd, const json& manifest, const std::string& what) {
  const auto& want = manifest["tensors"];
  ASSERT_EQ(sd.size(), want.size()) << what;
  size_t i = 0;
  for (const auto& [name, t] : sd) {
    const json& w = want[i++];
    EXPECT_EQ(name, w["name"].get<std::string>()) << what;
    EXPECT_EQ(dtype_name(t.dtype()), w["dtype"].get<std::string>()) << what << " " << name;
    EXPECT_EQ(t.shape(), w["shape"].get<Shape>()) << what << " " << name;
    EXPECT_EQ(hex(t), w["hex"].get<std::string>()) << what << " " << name;
  }
}

// Deterministic bytes; BOOL gets 0/1 only.
Tensor filled(const Shape& shape, DType dtype, unsigned seed) {
  Tensor t = Tensor::zeros(shape, dtype);
  std::byte* p = t.mutable_data();
  for (size_t i = 0; i < t.nbytes(); ++i) {
    unsigned v = (static_cast<unsigned>(i) * 37u + seed * 101u + 11u) & 0xFFu;
    p[i] = std::byte(dtype == DType::BOOL ? v & 1u : v);
  }
  return t;
}

class PtInterop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("grouplin_pt_interop_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "torch");
    save_ = run_peer("save '" + (dir_ / "torch").string() + "'", dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  void SetUp() override { ASSERT_EQ(save_.status, 0) << "python peer failed: " << save_.output; }

  static fs::path dir_;
  static PeerRun save_;
};

fs::path PtInterop::dir_;
PeerRun PtInterop::save_;

const char* kTorchCases[] = {"dtypes", "experts",    "shared",    "edge",   "noncontig",
                             "module", "plain_dict", "parameter", "bytesio"};

TEST_F(PtInterop, TorchFilesLoadBitExactly) {
  for (const char* c : kTorchCases) {
    const fs::path pt = dir_ / "torch" / (std::string(c) + ".pt");
    StateDict sd = load_pt(pt.string(), {.check_record_crc = true, .check_storage_crc = true});
    json manifest = read_json(dir_ / "torch" / (std::string(c) + ".json"));
    expect_matches(sd, manifest, c);
    for (const auto& group : manifest["shares"]) {
      const Tensor& first = sd.at(group[0].get<std::string>());
      for (const auto& n : group) {
        EXPECT_EQ(sd.at(n.get<std::string>()).storage(), first.storage()) << c << " " << n;
      }
    }
    // Zero-copy: contiguous tensors are read-only views of the mapping.
    for (const auto& [name, t] : sd) {
      EXPECT_EQ(t.writable(), std::string(c) == "noncontig") << c << " " << name;
    }
  }
}

TEST_F(PtInterop, GroupLinFilesLoadInTorch) {
  StateDict sd;
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I64,
                          DType::I32, DType::I16,  DType::I8,  DType::U8,  DType::BOOL};
  unsigned seed = 0;
  for (DType d : dtypes)
    sd.insert("dtypes." + std::string(dtype_name(d)), filled({2, 3}, d, seed++));
  for (int i = 0; i < 4; ++i)
    sd.insert("decoder.layers.0.mlp.fc1.weight" + std::to_string(i),
              filled({3, 2}, DType::F32, seed++));
  sd.insert("decoder.layers.1.mlp.fc1.weight", filled({4, 3, 2}, DType::BF16, seed++));
  Tensor base = filled({6, 4}, DType::F32, seed++);
  sd.insert("shared.base", base);
  sd.insert("shared.row2", base.select(2));
  sd.insert("shared.rows", base.rows(1, 3));
  sd.insert("edge.empty", Tensor::zeros({0, 3}, DType::F32));
  sd.insert("edge.scalar", filled({}, DType::F64, seed++));
  sd.insert("edge.big", filled({70000}, DType::F32, seed++));

  const fs::path pt = dir_ / "grouplin.pt";
  save_pt(pt.string(), sd);
  write_manifest(
      dir_ / "grouplin.json", sd,
      {{"metadata", true},
       {"shares", json::array({json::array({"shared.base", "shared.row2", "shared.rows"})})}});
  PeerRun r =
      run_peer("check '" + pt.string() + "' '" + (dir_ / "grouplin.json").string() + "'", dir_);
  EXPECT_EQ(r.status, 0) << r.output;
  // And it reads back here identically.
  expect_matches(load_pt(pt.string()), read_json(dir_ / "grouplin.json"), "grouplin.pt");
}

TEST_F(PtInterop, ModuleStateDictLoadsIntoATorchModule) {
  StateDict sd;
  sd.insert("0.weight", filled({3, 4}, DType::F32, 1));
  sd.insert("0.bias", filled({3}, DType::F32, 2));
  sd.insert("1.weight", filled({3}, DType::F32, 3));
  sd.insert("1.bias", filled({3}, DType::F32, 4));
  sd.insert("2.weight", filled({2, 3}, DType::F32, 5));
  sd.insert("2.bias", filled({2}, DType::F32, 6));
  const fs::path pt = dir_ / "mlp.pt";
  save_pt(pt.string(), sd);
  write_manifest(dir_ / "mlp.json", sd, {{"metadata", true}, {"module", "mlp"}});
  PeerRun r = run_peer("check '" + pt.string() + "' '" + (dir_ / "mlp.json").string() + "'", dir_);
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST_F(PtInterop, Float8AndWideUnsignedUseRebuildTensorV3) {
  // torch 1.13 has no float8 or uint16: the peer unpickles data.pkl with CPython's own
  // unpickler and stand-ins for the torch names, as newer PyTorch would interpret them.
  StateDict sd;
  sd.insert("w8", filled({2, 3}, DType::F8_E4M3, 1));
  sd.insert("w5", filled({4}, DType::F8_E5M2, 2));
  sd.insert("u16", filled({3}, DType::U16, 3));
  sd.insert("u32", filled({2}, DType::U32, 4));
  sd.insert("u64", filled({1}, DType::U64, 5));
  sd.insert("f32", filled({2}, DType::F32, 6));
  Tensor grouped = filled({2, 8}, DType::F8_E4M3, 7);
  sd.insert("grouped", grouped);
  sd.insert("grouped1", grouped.select(1));
  const fs::path pt = dir_ / "v3.pt";
  save_pt(pt.string(), sd);
  write_manifest(dir_ / "v3.json", sd, json::object());
  PeerRun r =
      run_peer("check_v3 '" + pt.string() + "' '" + (dir_ / "v3.json").string() + "'", dir_);
  EXPECT_EQ(r.status, 0) << r.output;
  StateDict back = load_pt(pt.string());
  expect_matches(back, read_json(dir_ / "v3.json"), "v3.pt");
  EXPECT_EQ(back.at("grouped").storage(), back.at("grouped1").storage());
}

TEST_F(PtInterop, TorchToGroupLinToTorchRoundTrip) {
  std::string pairs;
  for (const char* c : kTorchCases) {
    StateDict sd = load_pt((dir_ / "torch" / (std::string(c) + ".pt")).string());
    const fs::path out = dir_ / (std::string("round_") + c + ".pt");
    save_pt(out.string(), sd);
    json manifest = read_json(dir_ / "torch" / (std::string(c) + ".json"));
    manifest["metadata"] = true;
    const fs::path mpath = dir_ / (std::string("round_") + c + ".json");
    std::ofstream(mpath) << manifest.dump();
    pairs += " '" + out.string() + "' '" + mpath.string() + "'";
  }
  PeerRun r = run_peer("check" + pairs, dir_);  // one python start for all cases
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST_F(PtInterop, ThePeerNoticesADifference) {
  StateDict sd;
  sd.insert("w", filled({2}, DType::F32, 1));
  const fs::path pt = dir_ / "diff.pt";
  save_pt(pt.string(), sd);
  write_manifest(dir_ / "diff.json", sd, {{"metadata", true}});
  json m = read_json(dir_ / "diff.json");
  m["tensors"][0]["hex"] = "0000000000000000";
  std::ofstream(dir_ / "diff.json") << m.dump();
  PeerRun r = run_peer("check '" + pt.string() + "' '" + (dir_ / "diff.json").string() + "'", dir_);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("w: bytes"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace grouplin
