#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test, removed at the end.
class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "grouplin_mapped_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_file(const std::string& name, const std::string& bytes) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  fs::path dir_;
};

TEST_F(MappedFileTest, MapsTheWholeFile) {
  std::string path = write_file("a.bin", std::string("hello\0world", 11));
  auto file = MappedFile::open(path);
  EXPECT_EQ(file->path(), path);
  ASSERT_EQ(file->size(), 11u);
  EXPECT_EQ(std::memcmp(file->data(), "hello\0world", 11), 0);
}

TEST_F(MappedFileTest, EmptyFileWorks) {
  std::string path = write_file("empty.bin", "");
  auto file = MappedFile::open(path);
  EXPECT_EQ(file->size(), 0u);
  EXPECT_NE(file->data(), nullptr);
  auto storage = file->storage(0, 0);
  EXPECT_EQ(storage->size(), 0u);
  file->will_need(0, 100);
}

TEST_F(MappedFileTest, MissingFileNamesPathAndOsError) {
  std::string path = (dir_ / "missing.bin").string();
  try {
    MappedFile::open(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
    EXPECT_NE(e.message().find("\"" + path + "\""), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(std::strerror(ENOENT)), std::string::npos) << e.message();
  }
}

TEST_F(MappedFileTest, FolderIsNotAFile) {
  try {
    MappedFile::open(dir_.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
    EXPECT_NE(e.message().find("not a regular file"), std::string::npos) << e.message();
  }
}

TEST_F(MappedFileTest, StorageIsReadOnlyAndKeepsTheMappingAlive) {
  std::string path = write_file("a.bin", "0123456789");
  auto file = MappedFile::open(path);
  auto storage = file->storage(2, 5);
  EXPECT_EQ(storage->data(), file->data() + 2);
  EXPECT_EQ(storage->size(), 5u);
  EXPECT_FALSE(storage->writable());
  try {
    storage->mutable_data();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::ReadOnlyTensor);
  }
  file.reset();      // the storage still holds the mapping
  fs::remove(path);  // and the mapping holds the file's bytes
  EXPECT_EQ(std::memcmp(storage->data(), "23456", 5), 0);
}

TEST_F(MappedFileTest, StorageOutsideTheFileIsOutOfBounds) {
  auto file = MappedFile::open(write_file("a.bin", "0123456789"));
  EXPECT_NO_THROW(file->storage(10, 0));
  EXPECT_NO_THROW(file->storage(0, 10));
  const size_t kMax = std::numeric_limits<size_t>::max();
  for (auto [offset, len] :
       {std::pair<size_t, size_t>{11, 0}, {0, 11}, {5, 6}, {kMax, 1}, {1, kMax}, {kMax, kMax}}) {
    try {
      file->storage(offset, len);
      FAIL() << offset << " " << len;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::OutOfBounds);
      EXPECT_NE(e.message().find("a.bin"), std::string::npos) << e.message();
    }
  }
}

TEST_F(MappedFileTest, WillNeedClampsAnyRange) {
  std::string bytes(3 * 4096 + 17, 'x');
  auto file = MappedFile::open(write_file("a.bin", bytes));
  file->will_need(0, std::numeric_limits<size_t>::max());
  file->will_need(4097, 5);  // unaligned start
  file->will_need(file->size(), 10);
  file->will_need(std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max());
  EXPECT_EQ(std::memcmp(file->data(), bytes.data(), bytes.size()), 0);
}

TEST_F(MappedFileTest, MappingKeepsOldBytesWhenTheFileIsReplaced) {
  std::string path = write_file("a.bin", "old bytes!");
  auto file = MappedFile::open(path);
  auto out = AtomicFile::create(path);
  std::string fresh = "new bytes, longer";
  out->write(std::as_bytes(std::span(fresh.data(), fresh.size())));
  out->commit();
  EXPECT_EQ(std::memcmp(file->data(), "old bytes!", 10), 0);
  EXPECT_EQ(MappedFile::open(path)->size(), fresh.size());
}

// A bulk read of a mapping must not take one page fault per 4 KiB page (the kernel's fault-around
// and our read-ahead hint map many pages per fault). Counts faults, never time.
TEST_F(MappedFileTest, BulkReadTakesFewFaults) {
  const size_t kSize = size_t{64} << 20;
  std::string path = (dir_ / "big.bin").string();
  {
    std::ofstream out(path, std::ios::binary);
    std::string chunk(1 << 20, '\1');
    for (size_t i = 0; i < kSize; i += chunk.size()) out << chunk;
  }
  auto file = MappedFile::open(path);
  file->will_need(0, file->size());
  struct rusage before, after;
  ::getrusage(RUSAGE_SELF, &before);
  uint64_t sum = 0;
  const auto* p = reinterpret_cast<const uint8_t*>(file->data());
  for (size_t i = 0; i < kSize; i += 64) sum += p[i];
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_EQ(sum, kSize / 64);
  long faults = (after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt);
  long pages = static_cast<long>(kSize / 4096);
  RecordProperty("faults", std::to_string(faults));
  EXPECT_LT(faults, pages / 4) << faults << " faults for " << pages << " pages";
}

}  // namespace
}  // namespace grouplin
