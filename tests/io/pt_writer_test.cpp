// write_pt / save_pt: layout of the archive, round trips through parse_pt for every dtype,
// shared storages, determinism, refused inputs, and failures midway (through FileSink); every
// error save_pt can raise, with its code and its message naming the file and the tensor.
#include "io/formats/pt_writer.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "io/formats/zip.hpp"
#include "io/memory_sink.hpp"
#include "temp_dir_test.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

using test_io::MemorySink;

std::shared_ptr<Storage> to_storage(const std::vector<std::byte>& bytes) {
  auto s = Storage::allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(s->mutable_data(), bytes.data(), bytes.size());
  return s;
}

Tensor filled(const Shape& shape, DType dtype, unsigned seed) {
  Tensor t = Tensor::zeros(shape, dtype);
  std::byte* p = t.mutable_data();
  for (size_t i = 0; i < t.nbytes(); ++i) {
    unsigned v = (static_cast<unsigned>(i) * 13u + seed * 71u + 5u) & 0xFFu;
    p[i] = std::byte(dtype == DType::BOOL ? v & 1u : v);
  }
  return t;
}

StateDict round_trip(const StateDict& sd, MemorySink* out = nullptr) {
  MemorySink sink;
  write_pt(sink, sd);
  if (out) *out = sink;
  return parse_pt(to_storage(sink.bytes), "mem.pt",
                  {.check_record_crc = true, .check_storage_crc = true});
}

void expect_same(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [name, t] : a) EXPECT_TRUE(t.bit_equal(b.at(name))) << name;
}

TEST(PtWriter, RoundTripsEveryDType) {
  StateDict sd;
  unsigned seed = 0;
  for (DType d : kAllDTypes)
    sd.insert(std::string("t.") + std::string(dtype_name(d)), filled({2, 3}, d, seed++));
  sd.insert("zero", Tensor::zeros({0, 4}, DType::BF16));
  sd.insert("scalar", filled({}, DType::F64, seed++));
  expect_same(sd, round_trip(sd));
}

TEST(PtWriter, EmptyDict) { EXPECT_TRUE(round_trip(StateDict{}).empty()); }

TEST(PtWriter, LayoutIsTorchs) {
  StateDict sd;
  sd.insert("a.b.weight", filled({3}, DType::F32, 1));
  sd.insert("a.bias", filled({5}, DType::F16, 2));
  MemorySink sink;
  write_pt(sink, sd);
  zip::ZipReader z = zip::ZipReader::open(to_storage(sink.bytes));
  std::vector<std::string> names;
  for (const auto& e : z.entries()) {
    names.push_back(e.name);
    EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
    EXPECT_NO_THROW(z.check_crc(e));
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"archive/data.pkl", "archive/byteorder", "archive/data/0",
                                      "archive/data/1", "archive/version"}));
  auto text = [&](const char* n) {
    auto b = z.bytes(*z.find(n));
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  EXPECT_EQ(text("archive/byteorder"), "little");
  EXPECT_EQ(text("archive/version"), "3\n");
  const std::string pkl = text("archive/data.pkl");
  EXPECT_EQ(pkl.substr(0, 2), "\x80\x02");
  for (const char* s :
       {"_rebuild_tensor_v2", "FloatStorage", "HalfStorage", "_metadata", "a.b", "version"}) {
    EXPECT_NE(pkl.find(s), std::string::npos) << s;
  }
  EXPECT_EQ(pkl.back(), '.');
}

TEST(PtWriter, OverlappingViewsShareOneRecord) {
  Tensor base = filled({6, 4}, DType::F32, 3);
  StateDict sd;
  sd.insert("base", base);
  sd.insert("row2", base.select(2));
  sd.insert("rows", base.rows(1, 3));
  MemorySink sink;
  StateDict back = round_trip(sd, &sink);
  expect_same(sd, back);
  EXPECT_EQ(back.at("row2").storage(), back.at("base").storage());
  EXPECT_EQ(back.at("row2").data(), back.at("base").data() + 2 * 4 * 4);
  EXPECT_EQ(zip::ZipReader::open(to_storage(sink.bytes)).entries().size(),
            4u);  // one storage record
}

TEST(PtWriter, DisjointViewsGetTheirOwnRecords) {
  // Members of one allocation that do not overlap (a GroupedTensor, a safetensors mapping) are
  // written as separate storages, so torch does not see unrelated tensors as views of one blob.
  Tensor base = filled({4, 4}, DType::F32, 4);
  StateDict sd;
  sd.insert("top", base.rows(0, 2));
  sd.insert("bottom", base.rows(2, 2));
  sd.insert("as_int",
            Tensor::view_of(base.storage(), 0, {4}, DType::I32));  // overlaps, other dtype
  MemorySink sink;
  StateDict back = round_trip(sd, &sink);
  expect_same(sd, back);
  EXPECT_NE(back.at("top").storage(), back.at("bottom").storage());
  EXPECT_NE(back.at("top").storage(), back.at("as_int").storage());
  EXPECT_EQ(zip::ZipReader::open(to_storage(sink.bytes)).entries().size(), 6u);
}

TEST(PtWriter, Deterministic) {
  StateDict sd;
  for (int i = 0; i < 5; ++i)
    sd.insert("fc1.weight" + std::to_string(i), filled({2, 2}, DType::BF16, i));
  MemorySink a, b;
  write_pt(a, sd);
  write_pt(b, sd);
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(PtWriter, ManyEntriesUseSetItemsBatches) {
  StateDict sd;
  for (int i = 0; i < 2500; ++i) {
    std::string name = "e";  // appended: GCC 12 warns (-Wrestrict) falsely on "e" + std::string
    name += std::to_string(i);
    sd.insert(name, filled({1}, DType::U8, i));
  }
  StateDict back = round_trip(sd);
  expect_same(sd, back);
}

TEST(PtWriter, StreamsLargeTensorsInChunks) {
  StateDict sd;
  sd.insert("big", filled({3 << 20}, DType::F32, 9));  // 12 MiB
  MemorySink sink;
  expect_same(sd, round_trip(sd, &sink));
  EXPECT_LE(sink.largest_write, size_t{8} << 20);
}

TEST(PtWriter, RefusesUndefinedTensor) {
  StateDict sd;
  sd.insert("w", Tensor());
  MemorySink sink;
  try {
    write_pt(sink, sd);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::UndefinedTensor);
    EXPECT_NE(e.message().find("tensor \"w\" is undefined"), std::string::npos);
  }
  EXPECT_TRUE(sink.bytes.empty());  // checked before anything is written
}

TEST(PtWriter, RefusesNonUtf8Name) {
  StateDict sd;
  sd.insert("bad\xff", filled({1}, DType::F32, 1));
  MemorySink sink;
  try {
    write_pt(sink, sd);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
  EXPECT_TRUE(sink.bytes.empty());
}

TEST(PtWriter, SinkFailurePropagates) {
  StateDict sd;
  sd.insert("w", filled({1000}, DType::F32, 1));
  MemorySink sink;
  sink.fail_after_ = 500;
  try {
    write_pt(sink, sd);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
  }
}

TEST(PtWriter, SaveIsAtomic) {
  const fs::path dir =
      fs::temp_directory_path() / ("grouplin_pt_writer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "m.pt";
  StateDict sd;
  sd.insert("w", filled({4}, DType::F32, 1));
  save_pt(path.string(), sd);
  const auto before = fs::file_size(path);
  StateDict bad;
  bad.insert("ok", filled({4}, DType::F32, 2));
  bad.insert("undefined", Tensor());
  EXPECT_THROW(save_pt(path.string(), bad), Error);
  EXPECT_EQ(fs::file_size(path), before);
  expect_same(sd, load_pt(path.string()));
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);  // no temporary file left behind
  // Saving over the file the tensors are mapped from is safe.
  StateDict mapped = load_pt(path.string());
  save_pt(path.string(), mapped);
  expect_same(sd, load_pt(path.string()));
  fs::remove_all(dir);
}

// ---- save_pt's errors: each names the output file and, when it is about one, the tensor. ----
// (The failures of AtomicFile::commit, which save_pt calls last, are tested with injected faults
// in atomic_file_test.cpp; their messages start with the same `saving "<path>": `.)

class SavePtErrors : public test_files::TempDirTest {
 protected:
  SavePtErrors() : TempDirTest("grouplin_save_pt") {}

  // The names in the test folder (a temporary file left behind would show here).
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
};

TEST_F(SavePtErrors, EachRefusedInputNamesTheFileAndTheTensor) {
  const std::string out = path("out.pt");
  const std::string saving = "saving " + grouplin::quote(out) + ": ";
  StateDict old;
  old.insert("old", filled({3}, DType::F32, 7));
  struct Case {
    const char* what;
    std::string name;
    Tensor tensor;
    ErrorCode code;
    std::string message;
  };
  const std::string long_name(65537, 'n');
  const Case cases[] = {
      {"undefined", "w", Tensor(), ErrorCode::UndefinedTensor, "tensor \"w\" is undefined"},
      {"not UTF-8", "bad\xff", filled({1}, DType::F32, 1), ErrorCode::InvalidArgument,
       "tensor name \"bad\\xff\" is not valid UTF-8"},
      {"long name", long_name, filled({1}, DType::F32, 1), ErrorCode::PickleLimitExceeded,
       "tensor \"" + std::string(512, 'n') +
           "\"... (65537 bytes): a name of 65537 bytes, more than the 65536 the .pt reader "
           "accepts"},
      {"rank", "deep", Tensor::zeros(Shape(65, 1), DType::F32), ErrorCode::PickleLimitExceeded,
       "tensor \"deep\": 65 dimensions, more than the 64 the .pt reader accepts"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    save_pt(out, old);
    const std::string before = test_files::read_all(out);
    StateDict sd;
    sd.insert("fine", filled({2}, DType::F32, 2));
    sd.insert(c.name, c.tensor);
    try {
      save_pt(out, sd);
      FAIL() << "saved";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      EXPECT_EQ(e.message(), saving + c.message);
    }
    EXPECT_EQ(test_files::read_all(out), before);  // the old file is untouched
    EXPECT_EQ(files(), std::vector<std::string>{"out.pt"});
  }
}

// The writer's limits are the reader's: a name of exactly 65536 bytes and 64 dimensions load.
TEST_F(SavePtErrors, TheLimitsThemselvesAreAccepted) {
  StateDict sd;
  sd.insert(std::string(65536, 'n'), filled({2}, DType::F32, 1));
  sd.insert("deep", Tensor::zeros(Shape(64, 1), DType::F32));
  save_pt(path("out.pt"), sd);
  expect_same(sd, load_pt(path("out.pt")));
}

TEST_F(SavePtErrors, MissingFolderIsAnIoErrorNamingTheFile) {
  const std::string out = path("no/such/out.pt");
  StateDict sd;
  sd.insert("w", filled({4}, DType::F32, 1));
  try {
    save_pt(out, sd);
    FAIL() << "saved";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
    const std::string head =
        "saving " + grouplin::quote(out) + ": creating the temporary file \"" + out + ".tmp.";
    EXPECT_EQ(e.message().rfind(head, 0), 0u) << e.message();
    EXPECT_TRUE(e.message().ends_with(std::string("\": ") + std::strerror(ENOENT))) << e.message();
  }
}

// A write failing midway (the file size limit, in a child process since the limit is
// per-process): an IoError naming the file, its temporary file and the byte; nothing left.
TEST_F(SavePtErrors, WriteFailingMidwayIsAnIoErrorNamingTheFile) {
  const std::string out = path("out.pt");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::string report = "no error";
    try {
      StateDict sd;
      sd.insert("w", filled({1 << 14}, DType::F32, 1));  // 64 KiB
      save_pt(out, sd);
    } catch (const Error& e) {
      report = std::string(error_code_name(e.code())) + "|" + e.message();
    }
    const ssize_t n = ::write(fds[1], report.data(), report.size());
    ::_exit(n == static_cast<ssize_t>(report.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string head =
      "IoError|saving " + grouplin::quote(out) + ": writing \"" + out + ".tmp.";
  EXPECT_EQ(report.rfind(head, 0), 0u) << report;
  EXPECT_NE(report.find("\" at byte "), std::string::npos) << report;
  EXPECT_TRUE(report.ends_with(std::string(": ") + std::strerror(EFBIG))) << report;
  EXPECT_TRUE(files().empty());
}

// A pickle larger than the reader accepts (256 MiB by default; small limits here) is refused
// before anything is written, naming the file.
TEST(PtWriter, PickleOverTheReaderLimitIsRefused) {
  std::vector<detail::PtTensorSpec> tensors;
  std::vector<detail::PtRecordSpec> records;
  for (size_t k = 0; k < 20; ++k) {
    std::string name = "t";  // appended: GCC 12 warns (-Wrestrict) falsely on "t" + std::string
    name += std::to_string(k);
    tensors.push_back({name, DType::F32, {1}, k, 0});
    records.push_back({std::to_string(k), 4});
  }
  pickle::PickleLimits limits;
  limits.max_bytes = 512;
  try {
    detail::PtArchive archive(tensors, records, 0, "saving \"x.pt\"", limits);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::PickleLimitExceeded);
    EXPECT_EQ(e.message().rfind("saving \"x.pt\": the pickle of 20 tensors has ", 0), 0u)
        << e.message();
    EXPECT_TRUE(e.message().ends_with(" bytes, more than the 512 the .pt reader accepts"))
        << e.message();
  }
}

}  // namespace
}  // namespace grouplin
