// GroupLin against the reference `safetensors` package (tests/io/safetensors_peer.py): files
// either one writes load in the other with identical bytes. A failing peer fails the test.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/python_peer.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs the peer script with `args`; returns its exit status and puts its output in `output`.
int run_peer(const std::string& args, std::string& output) {
  return test_io::run_python_peer("tests/io/safetensors_peer.py", args, output);
}

std::string to_hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(line);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!line.empty() && line.back() == sep) parts.push_back("");
  return parts;
}

std::string bytes_of(const Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data()), t.nbytes());
}

struct Expected {
  std::string dtype;
  Shape shape;
  std::string data;
};

// One file's part of a manifest (format: see safetensors_peer.py).
struct Manifest {
  size_t count = 0;
  std::map<std::string, Expected> tensors;
  std::map<std::string, std::string> metadata;
};

std::map<std::string, Manifest> read_manifest(const fs::path& path) {
  std::map<std::string, Manifest> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> p = split(line, '\t');
    if (p.size() >= 3 && p[0] == "count") {
      out[p[1]].count = std::stoul(p[2]);
    } else if (p.size() == 6 && p[0] == "tensor") {
      Expected e{p[3], {}, from_hex(p[5])};
      for (const std::string& d : split(p[4], ',')) {
        if (!d.empty()) e.shape.push_back(std::stoll(d));
      }
      out[p[1]].tensors[from_hex(p[2])] = e;
    } else if (p.size() == 4 && p[0] == "meta") {
      out[p[1]].metadata[from_hex(p[2])] = from_hex(p[3]);
    }
  }
  return out;
}

std::string manifest_for(const std::string& file, const StateDict& sd,
                         const std::map<std::string, std::string>& metadata) {
  std::string out = "count\t" + file + "\t" + std::to_string(sd.size()) + "\n";
  for (const auto& [name, t] : sd) {
    std::string dims;
    for (size_t d = 0; d < t.rank(); ++d) {
      if (d) dims += ',';
      dims += std::to_string(t.dim(d));
    }
    out += "tensor\t" + file + "\t" + to_hex(name) + "\t" + std::string(dtype_name(t.dtype())) +
           "\t" + dims + "\t" + to_hex(bytes_of(t)) + "\n";
  }
  for (const auto& [k, v] : metadata) {
    out += "meta\t" + file + "\t" + to_hex(k) + "\t" + to_hex(v) + "\n";
  }
  return out;
}

Tensor patterned(const Shape& shape, DType dtype, int seed) {
  Tensor t = Tensor::zeros(shape, dtype);
  auto* p = reinterpret_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 13 + seed * 29 + 3);
  if (dtype == DType::BOOL) {
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] &= 1;  // valid booleans
  }
  return t;
}

class MemorySink : public FileSink {
 public:
  void write(std::span<const std::byte> bytes) override {
    data.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  uint64_t position() const override { return data.size(); }
  void commit() override {}
  std::string data;
};

class SafetensorsInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "grouplin_interop_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves `sd` with GroupLin and has the reference check it.
  void check_in_reference(const std::string& name, const StateDict& sd,
                          const std::map<std::string, std::string>& metadata) {
    std::string file = (dir_ / name).string();
    save_safetensors(file, sd, metadata);
    std::string manifest = file + ".manifest";
    std::ofstream(manifest) << manifest_for(name, sd, metadata);
    std::string output;
    int rc = run_peer("check " + file + " " + manifest, output);
    EXPECT_EQ(rc, 0) << "the reference disagrees with GroupLin's " << name << ":\n" << output;
  }

  fs::path dir_;
};

TEST_F(SafetensorsInterop, ReferenceFilesLoadWithIdenticalBytes) {
  std::string output;
  int rc = run_peer("write " + dir_.string(), output);
  ASSERT_EQ(rc, 0) << "the reference peer failed:\n" << output;
  std::map<std::string, Manifest> manifests = read_manifest(dir_ / "manifest.txt");
  ASSERT_EQ(manifests.size(), 3u) << output;
  for (const auto& [file, want] : manifests) {
    SCOPED_TRACE(file);
    SafetensorsFile got = load_safetensors((dir_ / file).string());
    ASSERT_GT(want.count, 0u);
    ASSERT_EQ(got.tensors.size(), want.count);
    ASSERT_EQ(want.tensors.size(), want.count);
    for (const auto& [name, e] : want.tensors) {
      const Tensor* t = got.tensors.find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(dtype_name(t->dtype()), e.dtype) << name;
      EXPECT_EQ(t->shape(), e.shape) << name;
      EXPECT_EQ(bytes_of(*t), e.data) << name;
      EXPECT_FALSE(t->writable()) << name;
    }
    EXPECT_EQ(got.metadata, want.metadata);

    // And GroupLin writes those tensors back byte for byte as the reference did.
    MemorySink sink;
    write_safetensors(sink, got.tensors, got.metadata);
    EXPECT_TRUE(sink.data == read_file(dir_ / file))
        << "GroupLin rewrites " << file << " differently";
  }
}

TEST_F(SafetensorsInterop, GroupLinFilesLoadInTheReferenceWithIdenticalBytes) {
  StateDict sd;
  int seed = 0;
  for (DType t : kAllDTypes) {
    std::string base(dtype_name(t));
    sd.insert(base + ".matrix", patterned({3, 5}, t, ++seed));
    sd.insert(base + ".scalar", patterned({}, t, ++seed));
    sd.insert(base + ".empty", patterned({0}, t, ++seed));
    sd.insert(base + ".empty3", patterned({2, 0, 3}, t, ++seed));
  }
  sd.insert("name with \"quotes\", \\, \xc3\xa9 and\nnewline", patterned({2}, DType::U8, 99));
  check_in_reference("all_dtypes.safetensors", sd, {{"format", "pt"}});
}

// Only dtypes torch 1.13 has, so that safetensors.torch loads the file too (BF16 included).
TEST_F(SafetensorsInterop, GroupLinFilesLoadInSafetensorsTorch) {
  StateDict sd;
  sd.insert("decoder.fc1.weight",
            Tensor::from_f32({2, 3}, std::vector<float>{1, -2, 3.5f, 0, 1e-3f, -7}));
  sd.insert("decoder.fc1.weight.bf16",
            Tensor::from_f32({2, 3}, std::vector<float>{1, -2, 3.5f, 0, 1e-3f, -7}, DType::BF16));
  sd.insert("decoder.fc1.weight.f16",
            Tensor::from_f32({3}, std::vector<float>{0.5f, 65504.0f, -1e-4f}, DType::F16));
  sd.insert("steps", patterned({}, DType::I64, 1));
  sd.insert("mask", patterned({5}, DType::BOOL, 2));
  sd.insert("codes", patterned({4}, DType::I8, 3));
  sd.insert("bias64", patterned({2}, DType::F64, 4));
  check_in_reference("torch_dtypes.safetensors", sd, {{"format", "pt"}});
  check_in_reference("no_metadata.safetensors", sd, {});
}

// A peer that cannot run (here: a command it does not know) must fail loudly, not skip.
TEST_F(SafetensorsInterop, PeerFailureIsReported) {
  std::string output;
  EXPECT_NE(run_peer("no-such-command", output), 0);
}

}  // namespace
}  // namespace grouplin
