#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/safetensors.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

// Keeps everything written, and where each write() took its bytes from.
class MemorySink : public FileSink {
 public:
  void write(std::span<const std::byte> bytes) override {
    calls.push_back({bytes.data(), bytes.size()});
    data.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  uint64_t position() const override { return data.size(); }
  void commit() override { committed = true; }

  struct Call {
    const std::byte* from;
    size_t size;
  };
  std::string data;
  std::vector<Call> calls;
  bool committed = false;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Tensor tensor_with_bytes(const Shape& shape, DType dtype, const std::string& bytes) {
  Tensor t = Tensor::zeros(shape, dtype);
  EXPECT_EQ(t.nbytes(), bytes.size());
  if (!bytes.empty()) std::memcpy(t.mutable_data(), bytes.data(), bytes.size());
  return t;
}

// Every byte differs from its neighbours, and from the same byte of other tensors.
Tensor patterned(const Shape& shape, DType dtype, int seed) {
  Tensor t = Tensor::zeros(shape, dtype);
  auto* p = reinterpret_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 7 + seed * 31 + 1);
  return t;
}

class SafetensorsWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "grouplin_writer_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// The expected file, worked out by hand: metadata first; F32 (4-byte) before BF16 (2) before U8
// (1); a header of 193 bytes padded with 7 spaces to 200 = 0xC8; then the raw data.
TEST_F(SafetensorsWriterTest, WritesExactlyTheExpectedBytes) {
  StateDict sd;
  sd.insert("b", tensor_with_bytes({2}, DType::F32, std::string("\0\0\x80\x3f\0\0\0\x40", 8)));
  sd.insert("a", tensor_with_bytes({3}, DType::U8, "\x01\x02\x03"));
  sd.insert("c", tensor_with_bytes({}, DType::BF16, "\x80\x3f"));
  MemorySink sink;
  write_safetensors(sink, sd, {{"format", "pt"}});

  const std::string expected = std::string("\xc8\0\0\0\0\0\0\0", 8) +
                               "{\"__metadata__\":{\"format\":\"pt\"},"
                               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                               "\"c\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[8,10]},"
                               "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[10,13]}}"
                               "       " +
                               std::string("\0\0\x80\x3f\0\0\0\x40", 8) + "\x80\x3f" +
                               "\x01\x02\x03";
  EXPECT_EQ(sink.data, expected);
  EXPECT_FALSE(sink.committed);  // committing is the caller's business
}

TEST_F(SafetensorsWriterTest, EmptyStateDict) {
  MemorySink sink;
  write_safetensors(sink, StateDict{});
  EXPECT_EQ(sink.data, std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  MemorySink with_metadata;
  write_safetensors(with_metadata, StateDict{}, {{"framework", "pt"}});
  EXPECT_EQ(with_metadata.data, std::string("\x28\0\0\0\0\0\0\0", 8) +
                                    "{\"__metadata__\":{\"framework\":\"pt\"}}     ");
}

TEST_F(SafetensorsWriterTest, DataIsWrittenStraightFromEachTensor) {
  StateDict sd;
  sd.insert("small", patterned({3}, DType::U8, 1));
  sd.insert("big", patterned({256, 64}, DType::F32, 2));
  sd.insert("empty", patterned({0, 4}, DType::F32, 3));
  MemorySink sink;
  write_safetensors(sink, sd);
  // length, header, then one write per non-empty tensor, from the tensor's own memory.
  ASSERT_EQ(sink.calls.size(), 4u);
  EXPECT_EQ(sink.calls[0].size, 8u);
  EXPECT_EQ(sink.calls[2].from, sd.at("big").data());
  EXPECT_EQ(sink.calls[2].size, sd.at("big").nbytes());
  EXPECT_EQ(sink.calls[3].from, sd.at("small").data());
}

TEST_F(SafetensorsWriterTest, OrderFollowsTheReference) {
  StateDict sd;
  // Within one element size the reference's dtype rank decides (U64 > I64 > F64), not the name.
  sd.insert("a", patterned({1}, DType::F64, 1));
  sd.insert("b", patterned({1}, DType::I64, 2));
  sd.insert("c", patterned({1}, DType::U64, 3));
  sd.insert("z", patterned({1}, DType::BOOL, 4));
  sd.insert("y", patterned({1}, DType::F16, 5));
  sd.insert("x", patterned({1}, DType::BF16, 6));
  sd.insert("w", patterned({1}, DType::F32, 7));
  sd.insert("v", patterned({1}, DType::F32, 8));
  sd.insert("B", patterned({1}, DType::F32, 9));  // bytewise: "B" < "v"
  MemorySink sink;
  write_safetensors(sink, sd);
  SafetensorsFile back = parse_safetensors(
      [&] {
        auto s = Storage::allocate(sink.data.size());
        std::memcpy(s->mutable_data(), sink.data.data(), sink.data.size());
        return s;
      }(),
      "mem");
  EXPECT_EQ(back.tensors.keys(),
            (std::vector<std::string>{"c", "b", "a", "B", "v", "w", "x", "y", "z"}));
}

TEST_F(SafetensorsWriterTest, NamesAreEscapedAsJson) {
  StateDict sd;
  std::string name = std::string("q\"b\\s\n\t\x01\x7f/\xc3\xa9", 12);
  sd.insert(name, tensor_with_bytes({1}, DType::U8, "z"));
  MemorySink sink;
  write_safetensors(sink, sd);
  EXPECT_NE(sink.data.find("{\"q\\\"b\\\\s\\n\\t\\u0001\x7f/\xc3\xa9\":{"), std::string::npos)
      << sink.data;
  std::string file = path("escaped.safetensors");
  save_safetensors(file, sd);
  EXPECT_EQ(load_safetensors(file).tensors.keys(), (std::vector<std::string>{name}));
}

TEST_F(SafetensorsWriterTest, EveryDTypeRoundTrips) {
  StateDict sd;
  int seed = 0;
  for (DType t : kAllDTypes) {
    std::string base = std::string(dtype_name(t));
    sd.insert(base + ".matrix", patterned({3, 5}, t, ++seed));
    sd.insert(base + ".scalar", patterned({}, t, ++seed));
    sd.insert(base + ".empty", patterned({2, 0}, t, ++seed));
  }
  std::string file = path("all.safetensors");
  save_safetensors(file, sd, {{"format", "pt"}, {"note", "every dtype"}});
  SafetensorsFile back = load_safetensors(file);
  ASSERT_EQ(back.tensors.size(), sd.size());
  for (const auto& [name, t] : sd) {
    const Tensor* u = back.tensors.find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_TRUE(u->bit_equal(t)) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(u->data()) % dtype_size(t.dtype()), 0u) << name;
    EXPECT_FALSE(u->writable()) << name;  // zero-copy views of the mapping
  }
  EXPECT_EQ(back.metadata,
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "every dtype"}}));
}

TEST_F(SafetensorsWriterTest, OutputIsDeterministic) {
  StateDict forward, backward;
  std::vector<std::pair<std::string, Tensor>> items = {
      {"x.weight", patterned({4, 4}, DType::BF16, 1)},
      {"x.bias", patterned({4}, DType::F32, 2)},
      {"y.count", patterned({}, DType::I64, 3)},
      {"y.mask", patterned({7}, DType::BOOL, 4)},
  };
  for (const auto& [n, t] : items) forward.insert(n, t);
  for (auto it = items.rbegin(); it != items.rend(); ++it) backward.insert(it->first, it->second);
  std::map<std::string, std::string> meta = {{"z", "1"}, {"a", "2"}, {"m", "3"}};
  save_safetensors(path("a.safetensors"), forward, meta);
  save_safetensors(path("b.safetensors"), backward, meta);
  save_safetensors(path("c.safetensors"), forward, meta);
  EXPECT_EQ(read_file(path("a.safetensors")), read_file(path("b.safetensors")));
  EXPECT_EQ(read_file(path("a.safetensors")), read_file(path("c.safetensors")));
}

TEST_F(SafetensorsWriterTest, SavingOverTheLoadedFileIsSafe) {
  StateDict sd;
  sd.insert("w", patterned({64, 64}, DType::F32, 1));
  std::string file = path("model.safetensors");
  save_safetensors(file, sd, {{"v", "1"}});
  SafetensorsFile loaded = load_safetensors(file);
  save_safetensors(file, loaded.tensors, {{"v", "2"}});  // reads from the old mapping
  SafetensorsFile again = load_safetensors(file);
  EXPECT_TRUE(again.tensors.at("w").bit_equal(sd.at("w")));
  EXPECT_EQ(again.metadata.at("v"), "2");
}

// Rejected inputs: nothing reaches the sink.
TEST_F(SafetensorsWriterTest, BadInputIsRejectedBeforeWriting) {
  struct Bad {
    StateDict sd;
    std::map<std::string, std::string> meta;
    ErrorCode code;
    std::string needle;
  };
  std::vector<Bad> cases(4);
  cases[0].sd.insert("u", Tensor());
  cases[0].code = ErrorCode::UndefinedTensor;
  cases[0].needle = "tensor \"u\" is undefined";
  cases[1].sd.insert("__metadata__", patterned({1}, DType::U8, 1));
  cases[1].code = ErrorCode::InvalidArgument;
  cases[1].needle = "reserved";
  cases[2].sd.insert("bad\xff", patterned({1}, DType::U8, 1));
  cases[2].code = ErrorCode::InvalidArgument;
  cases[2].needle = "tensor name \"bad\\xff\" is not valid UTF-8";
  cases[3].meta = {{"k", "\xc3"}};
  cases[3].code = ErrorCode::InvalidMetadata;
  cases[3].needle = "not valid UTF-8";
  for (const Bad& c : cases) {
    MemorySink sink;
    try {
      write_safetensors(sink, c.sd, c.meta);
      ADD_FAILURE() << "no error for " << c.needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      EXPECT_NE(e.message().find(c.needle), std::string::npos) << e.message();
      EXPECT_EQ(e.message().rfind("writing safetensors: ", 0), 0u) << e.message();
    }
    EXPECT_EQ(sink.position(), 0u);
  }
}

// The header runs through the reader's validator before anything is written.
TEST_F(SafetensorsWriterTest, HeaderOverTheCapIsRejected) {
  StateDict sd;
  sd.insert(std::string(kSafetensorsMaxHeaderSize, 'n'), patterned({1}, DType::U8, 1));
  MemorySink sink;
  try {
    write_safetensors(sink, sd);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::HeaderTooLarge);
  }
  EXPECT_EQ(sink.position(), 0u);
}

TEST_F(SafetensorsWriterTest, SaveErrorsNameThePathAndLeaveNothingBehind) {
  StateDict sd;
  sd.insert("u", Tensor());
  std::string file = path("x.safetensors");
  try {
    save_safetensors(file, sd);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::UndefinedTensor);
    EXPECT_EQ(e.message().rfind("saving \"" + file + "\": ", 0), 0u) << e.message();
  }
  EXPECT_TRUE(fs::is_empty(dir_));
  EXPECT_THROW(save_safetensors(path("missing/x.safetensors"), StateDict{}), Error);
  EXPECT_TRUE(fs::is_empty(dir_));
}

}  // namespace
}  // namespace grouplin
