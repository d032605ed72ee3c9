// parse_pt / load_pt on tiny hand-made archives: each named check of the .pt layer, the message
// format (file, record, offset, rule), zero-copy views, copies where needed, and code-execution
// pickles that must be refused without running anything.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "io/amplifying_pickles.hpp"
#include "io/error_code_groups.hpp"
#include "io/formats/zip.hpp"
#include "io/memory_sink.hpp"
#include "io/pickle_builder.hpp"
#include "io/pt_archive.hpp"

// GCC 12 warns about members left out of designated initializers even when they have default
// member initializers (fixed in GCC 13); TensorSpec relies on those defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace grouplin {
namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;

using namespace test_pickle;
using test_io::MemorySink;

// --- Archives. ---
using test_io::archive;
using test_io::Records;
using test_io::to_storage;

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

// A valid file: "w" F32 [2, 3] with values 0..5 in storage "0".
Records valid_records(std::string folder = "archive") {
  return {{folder + "/data.pkl", state_dict({{"w", tensor({})}})},
          {folder + "/byteorder", "little"},
          {folder + "/data/0", floats({0, 1, 2, 3, 4, 5})},
          {folder + "/version", "3\n"}};
}

StateDict parse(const std::vector<std::byte>& bytes, const PtReadOptions& options = {}) {
  return parse_pt(to_storage(bytes), "t.pt", options);
}

void expect_error(const std::vector<std::byte>& bytes, ErrorCode code, const std::string& part,
                  const PtReadOptions& options = {}) {
  try {
    parse(bytes, options);
    FAIL() << "expected " << error_code_name(code) << " containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.message().rfind("loading \"t.pt\": ", 0), 0u) << e.what();
    EXPECT_NE(e.message().find(part), std::string::npos) << e.what();
  }
}

TEST(PtReader, ReadsAHandMadeFileZeroCopy) {
  auto file = to_storage(archive(valid_records("my model-1")));
  StateDict sd = parse_pt(file, "t.pt");
  ASSERT_EQ(sd.size(), 1u);
  const Tensor& w = sd.at("w");
  EXPECT_EQ(w.shape(), (Shape{2, 3}));
  EXPECT_EQ(w.dtype(), DType::F32);
  EXPECT_EQ(w.data_as<float>()[5], 5.0f);
  EXPECT_TRUE(w.writable());  // as `file` is (a copy-on-write mapping is)
  EXPECT_GE(w.data(), file->data());
  EXPECT_LT(w.data(), file->data() + file->size());
  // Over read-only bytes (a read-only mapping), read-only views.
  StateDict ro = parse_pt(Storage::wrap(file->data(), file->size(), file), "t.pt");
  EXPECT_FALSE(ro.at("w").writable());
  EXPECT_EQ(ro.at("w").data(), w.data());
}

TEST(PtReader, RefusesCodeExecutionAndRunsNothing) {
  const fs::path dir =
      fs::temp_directory_path() / ("grouplin_canary_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path canary = dir / "CANARY";
  const std::string touch = "touch " + canary.string();
  struct Case {
    std::string pickle;
    ErrorCode code;
    std::string part;
  };
  const Case cases[] = {
      {"cposix\nsystem\n(S'" + touch + "'\ntR.", ErrorCode::ForbiddenGlobal,
       "record \"archive/data.pkl\" offset 0: forbidden global \"posix.system\""},
      {"\x80\x02" + G("os", "system") + U(touch) + "\x85R.", ErrorCode::ForbiddenGlobal,
       "offset 2: forbidden global \"os.system\""},
      {"\x80\x02" + G("builtins", "eval") + U("__import__('os').system('" + touch + "')") +
           "\x85R.",
       ErrorCode::ForbiddenGlobal, "forbidden global \"builtins.eval\""},
      {"\x80\x02" + U("os") + U("system") + "\x93" + U(touch) + "\x85R.",
       ErrorCode::ForbiddenOpcode, "offset 20: forbidden opcode STACK_GLOBAL"},
      {"\x80\x02(" + U(touch) + "ios\nsystem\n.", ErrorCode::ForbiddenOpcode,
       "forbidden opcode INST"},
  };
  for (const Case& c : cases) {
    Records r = valid_records();
    r[0].second = c.pickle;
    expect_error(archive(r), c.code, c.part);
    EXPECT_FALSE(fs::exists(canary));
  }
  // Through a real file too: the message names it.
  const fs::path file = dir / "m.pt";
  Records r = valid_records();
  r[0].second = cases[0].pickle;
  auto bytes = archive(r);
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  try {
    load_pt(file.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ForbiddenGlobal);
    EXPECT_EQ(e.message().rfind("loading \"" + file.string() +
                                    "\": record \"archive/data.pkl\" offset 0: forbidden global "
                                    "\"posix.system\": GroupLin runs nothing from a file",
                                0),
              0u)
        << e.message();
  }
  EXPECT_FALSE(fs::exists(canary));
  fs::remove_all(dir);
}

// What the .pt fuzzer did with the amplifying files when they were in its corpus (they cost it
// up to 8 s each under AddressSanitizer): each, at that size, is refused with a named error or
// read, written back and read again with the same values.
TEST(PtReader, AmplifyingFilesAreRefusedOrRoundTrip) {
  for (const Amplifier& a : kAmplifiers) {
    SCOPED_TRACE(a.name);
    const std::string file = pt_archive(a.make(136 << 10));
    const auto* begin = reinterpret_cast<const std::byte*>(file.data());
    try {
      const StateDict sd = parse(std::vector<std::byte>(begin, begin + file.size()));
      MemorySink sink;
      write_pt(sink, sd);
      const StateDict back = parse(sink.bytes);
      ASSERT_EQ(back.keys(), sd.keys());
      for (const auto& [name, t] : sd) EXPECT_TRUE(t.bit_equal(back.at(name))) << name;
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::PickleLimitExceeded ||
                  e.code() == ErrorCode::InvalidPickle)
          << e.what();
    }
  }
}

TEST(PtReader, EmptyArchive) {
  expect_error(archive({}), ErrorCode::MissingRecord, "the archive has no records");
}

TEST(PtReader, RecordsMustShareOneFolder) {
  Records r = valid_records();
  r.push_back({"other/data/1", "x"});
  expect_error(archive(r), ErrorCode::InvalidZip,
               "record \"other/data/1\" is outside the folder \"archive/\"");
  expect_error(archive({{"data.pkl", "."}}), ErrorCode::InvalidZip,
               "record \"data.pkl\" is not inside a folder");
}

TEST(PtReader, MissingDataPkl) {
  Records r = valid_records();
  r.erase(r.begin());
  expect_error(archive(r), ErrorCode::MissingRecord, "no record \"archive/data.pkl\"");
}

TEST(PtReader, BigEndianRefused) {
  Records r = valid_records();
  r[1].second = "big";
  expect_error(archive(r), ErrorCode::UnknownFormat, "record \"archive/byteorder\" is \"big\"");
}

TEST(PtReader, StorageRecordMissing) {
  Records r = valid_records();
  r.erase(r.begin() + 2);
  expect_error(archive(r), ErrorCode::MissingRecord,
               "storage \"0\" (torch.FloatStorage) has no record \"archive/data/0\"");
}

TEST(PtReader, StorageSizeMismatch) {
  // PyTorch 1.13 itself loads a 64x64 tensor from a 100-byte record; we refuse.
  Records r = valid_records();
  r[0].second = state_dict({{"w", tensor({.numel = 4096, .size = {64, 64}, .stride = {64, 1}})}});
  r[2].second = std::string(100, '\0');
  expect_error(
      archive(r), ErrorCode::StorageSizeMismatch,
      "record \"archive/data/0\" has 100 bytes but storage \"0\" is torch.FloatStorage of 4096 "
      "elements (16384 bytes)");
}

TEST(PtReader, StorageTooSmall) {
  Records r = valid_records();
  r[0].second = state_dict({{"w", tensor({.offset = 1})}});
  expect_error(archive(r), ErrorCode::StorageTooSmall, "record \"archive/data.pkl\" offset");
}

TEST(PtReader, PickleCrcChecked) {
  auto bytes = archive(valid_records());
  zip::ZipReader z = zip::ZipReader::open(to_storage(bytes));
  // Damage the STOP opcode's neighbour: the CRC catches it before the pickle runs.
  const zip::Entry* pkl = z.find("archive/data.pkl");
  bytes[pkl->data_offset + pkl->size - 2] = std::byte{'N'};
  expect_error(bytes, ErrorCode::CrcMismatch, "entry \"archive/data.pkl\": data has CRC-32");
  expect_error(bytes, ErrorCode::PickleStackError, "offset", {.check_record_crc = false});
}

TEST(PtReader, StorageCrcOnlyWhenAsked) {
  auto bytes = archive(valid_records());
  zip::ZipReader z = zip::ZipReader::open(to_storage(bytes));
  bytes[z.find("archive/data/0")->data_offset] = std::byte{0x7F};
  EXPECT_NO_THROW(parse(bytes));
  expect_error(bytes, ErrorCode::CrcMismatch, "entry \"archive/data/0\"",
               {.check_storage_crc = true});
}

TEST(PtReader, MisalignedRecordIsCopied) {
  // With 1-byte alignment, find a padding record size that puts data/0 off a 4-byte boundary.
  for (int pad = 0; pad < 4; ++pad) {
    Records r = valid_records();
    r.insert(r.begin(), {"archive/pad", std::string(static_cast<size_t>(pad), 'p')});
    auto bytes = archive(r, {.alignment = 1});
    auto file = to_storage(bytes);
    zip::ZipReader z = zip::ZipReader::open(file);
    if (z.find("archive/data/0")->data_offset % 4 == 0) continue;
    StateDict sd = parse_pt(file, "t.pt");
    const Tensor& w = sd.at("w");
    EXPECT_TRUE(w.writable());  // a heap copy
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data()) % 4, 0u);
    EXPECT_EQ(w.data_as<float>()[4], 4.0f);
    return;
  }
  FAIL() << "no misaligned layout found";
}

TEST(PtReader, NonContiguousIsCopiedRowMajor) {
  Records r = valid_records();
  // Storage 0..5 viewed as the transpose of [2, 3]: [[0, 3], [1, 4], [2, 5]].
  r[0].second = state_dict({{"t", tensor({.size = {3, 2}, .stride = {1, 3}})},
                            {"bcast", tensor({.size = {2, 3}, .stride = {0, 1}})}});
  StateDict sd = parse(archive(r));
  const float* t = sd.at("t").data_as<float>();
  EXPECT_EQ(std::vector<float>(t, t + 6), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  const float* b = sd.at("bcast").data_as<float>();
  EXPECT_EQ(std::vector<float>(b, b + 6), (std::vector<float>{0, 1, 2, 0, 1, 2}));
  EXPECT_TRUE(sd.at("t").writable());
}

TEST(PtReader, SharedStorageIsOneZeroCopyView) {
  Records r = valid_records();
  // "same" is the tensor "all" again, fetched from the memo (as Python pickles one object twice).
  r[0].second = "\x80\x02" + kOrderedDict + "(" + U("all") + tensor({}) + "q\x01"s + U("row1") +
                tensor({.offset = 3, .size = {3}, .stride = {1}}) + U("same") + "h\x01u."s;
  StateDict sd = parse(archive(r));
  EXPECT_EQ(sd.at("all").storage(), sd.at("row1").storage());
  EXPECT_EQ(sd.at("row1").data(), sd.at("all").data() + 12);
  EXPECT_TRUE(sd.at("same").same_view(sd.at("all")));
  EXPECT_EQ(sd.at("row1").data_as<float>()[0], 3.0f);
}

TEST(PtReader, ZeroSizeAndScalarTensors) {
  Records r = valid_records();
  r[0].second =
      state_dict({{"empty", tensor({.key = "1", .numel = 0, .size = {0, 3}, .stride = {3, 1}})},
                  {"scalar", tensor({.offset = 2, .size = {}, .stride = {}})}});
  r.push_back({"archive/data/1", ""});
  StateDict sd = parse(archive(r));
  EXPECT_EQ(sd.at("empty").numel(), 0);
  EXPECT_EQ(sd.at("scalar").rank(), 0u);
  EXPECT_EQ(sd.at("scalar").data_as<float>()[0], 2.0f);
}

TEST(PtReader, ForcedZip64Archive) {
  StateDict sd = parse(archive(valid_records(), {.alignment = 64, .force_zip64 = true}));
  EXPECT_EQ(sd.at("w").data_as<float>()[3], 3.0f);
}

TEST(PtReader, MissingFile) {
  try {
    load_pt("/nonexistent/dir/x.pt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
  }
}

// Codes parse_pt never raises for file content: other layers, and the safetensors format.
bool never_thrown_by_pt_reader(ErrorCode code) {
  if (test_io::raised_outside_file_parsing(code)) return true;
  switch (code) {
    case ErrorCode::FileTooSmall:
    case ErrorCode::HeaderTooLarge:
    case ErrorCode::HeaderPastEnd:
    case ErrorCode::InvalidHeader:
    case ErrorCode::InvalidMetadata:
    case ErrorCode::UnknownDType:
    case ErrorCode::InvalidOffsets:
    case ErrorCode::OffsetsNotContiguous:
    case ErrorCode::TensorSizeMismatch:
    case ErrorCode::TrailingBytes:
      return true;
    default:
      return false;
  }
}

// Walks the whole ErrorCode list: every code the .pt path can raise is reached through
// parse_pt from a small input, every other one is excluded above, so that a new code is noticed.
TEST(PtReader, EveryErrorCodeIsCoveredOrExcluded) {
  auto with_pickle = [](const std::string& p) {
    Records r = valid_records();
    r[0].second = p;
    return archive(r);
  };
  auto patched = [](std::vector<std::byte> b, size_t at, std::byte v) {
    b[at] = v;
    return b;
  };
  auto good = archive(valid_records());
  const size_t cd = std::to_integer<size_t>(good[good.size() - 6]) |
                    (std::to_integer<size_t>(good[good.size() - 5]) << 8);
  auto dup = archive({{"a/x", "1"}, {"a/y", "2"}});
  {
    const size_t cd2 = std::to_integer<size_t>(dup[dup.size() - 6]) |
                       (std::to_integer<size_t>(dup[dup.size() - 5]) << 8);
    dup[cd2 + 46 + 3 + 46 + 2] = std::byte{'x'};  // second central name "a/y" -> "a/x"
    const size_t local2 = std::to_integer<size_t>(dup[cd2 + 49 + 42]);
    dup[local2 + 30 + 2] = std::byte{'x'};
  }
  auto bad_crc = good;
  bad_crc[64 + 3] = std::byte{'Z'};  // inside data.pkl (data starts at 64)
  struct Case {
    ErrorCode code;
    std::vector<std::byte> bytes;
  };
  std::vector<Case> cases = {
      {ErrorCode::InvalidZip, std::vector<std::byte>(30, std::byte{1})},
      {ErrorCode::Truncated, std::vector<std::byte>(good.begin(), good.end() - 1)},
      {ErrorCode::CompressedEntry, patched(good, cd + 10, std::byte{8})},
      {ErrorCode::EncryptedEntry, patched(good, cd + 8, std::byte{9})},
      {ErrorCode::ZipHeaderMismatch, patched(good, 30, std::byte{'X'})},
      {ErrorCode::CrcMismatch, bad_crc},
      {ErrorCode::DuplicateName, dup},
      {ErrorCode::MissingRecord, archive({{"a/version", "3"}})},
      {ErrorCode::UnknownFormat, archive({{"a/data.pkl", "."}, {"a/byteorder", "big"}})},
      {ErrorCode::ForbiddenOpcode, with_pickle("\x93.")},
      {ErrorCode::ForbiddenGlobal, with_pickle("cos\nsystem\n.")},
      {ErrorCode::PickleStackError, with_pickle("R.")},
      {ErrorCode::PickleLimitExceeded, with_pickle(std::string(1000, '('))},
      {ErrorCode::InvalidPickle, with_pickle("N.")},
      {ErrorCode::UnsupportedDType, with_pickle("ctorch\ncomplex64\n.")},
      {ErrorCode::StorageTooSmall, with_pickle(state_dict({{"w", tensor({.numel = 5})}}))},
      {ErrorCode::StorageSizeMismatch,
       with_pickle(state_dict({{"w", tensor({.numel = 7, .size = {7}, .stride = {1}})}}))},
      {ErrorCode::SizeOverflow,
       with_pickle(state_dict({{"w", tensor({.size = {int64_t{1} << 62, 4}, .stride = {1, 1}})}}))},
      {ErrorCode::Truncated, with_pickle("N")},
  };
  for (const Case& c : cases) {
    try {
      parse(c.bytes);
      ADD_FAILURE() << "no error for " << error_code_name(c.code);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      EXPECT_EQ(e.message().rfind("loading \"t.pt\": ", 0), 0u) << e.what();
    }
  }
  const ErrorCode all[] = {
#define GROUPLIN_LIST_ENTRY(name) ErrorCode::name,
      GROUPLIN_ERROR_CODES(GROUPLIN_LIST_ENTRY)
#undef GROUPLIN_LIST_ENTRY
  };
  for (ErrorCode code : all) {
    bool covered =
        std::any_of(cases.begin(), cases.end(), [&](const Case& c) { return c.code == code; });
    EXPECT_NE(covered, never_thrown_by_pt_reader(code))
        << error_code_name(code)
        << ": add an input above, or exclude it in never_thrown_by_pt_reader";
  }
}

}  // namespace
}  // namespace grouplin
