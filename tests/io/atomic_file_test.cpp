#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/safetensors.hpp"
#include "io/checkpoints/atomic_directory.hpp"
#include "io/checkpoints/commit_calls.hpp"
#include "io/checkpoints/free_space.hpp"

namespace grouplin {
namespace {

namespace fs = std::filesystem;

std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "grouplin_atomic_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (dir_ / "out.bin").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Files in the folder other than the final one: leftover temporaries.
  std::vector<std::string> temporaries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().string() != path_) out.push_back(e.path().string());
    }
    return out;
  }

  void write_old(const std::string& bytes) { std::ofstream(path_, std::ios::binary) << bytes; }

  fs::path dir_;
  std::string path_;
};

TEST_F(AtomicFileTest, WritesAndCommits) {
  auto f = AtomicFile::create(path_);
  f->write(as_bytes("hello "));
  f->write(as_bytes(""));
  f->write(as_bytes("world"));
  EXPECT_EQ(f->position(), 11u);
  EXPECT_FALSE(fs::exists(path_));  // nothing under the final name before commit()
  f->commit();
  EXPECT_EQ(read_file(path_), "hello world");
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(AtomicFileTest, TemporaryIsBesideTheTargetWithPidAndRandomSuffix) {
  auto a = AtomicFile::create(path_);
  auto b = AtomicFile::create(path_);
  std::string prefix = path_ + ".tmp." + std::to_string(::getpid()) + ".";
  EXPECT_EQ(a->temp_path().rfind(prefix, 0), 0u) << a->temp_path();
  EXPECT_NE(a->temp_path(), b->temp_path());
  EXPECT_TRUE(fs::exists(a->temp_path()));
  EXPECT_TRUE(fs::exists(b->temp_path()));
}

// A pid that ran and has exited: a child reaped at once.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// A writer killed outright (SIGKILL) leaves its temporary; the next writer of the same output
// removes it, and leaves alone one whose writer still runs, links and other outputs' temporaries.
TEST_F(AtomicFileTest, LeftoversOfAKilledWriterAreRemovedByTheNext) {
  const std::string dead = std::to_string(dead_pid()), alive = std::to_string(::getppid());
  const std::vector<std::string> stale = {path_ + ".tmp." + dead + ".0123456789abcdef"};
  const std::vector<std::string> kept = {path_ + ".tmp." + alive + ".0123456789abcdef",
                                         (dir_ / "other.bin.tmp.").string() + dead + ".0abc",
                                         path_ + ".tmp." + dead + ".not-ours",
                                         path_ + ".tmp.x" + dead + ".abc"};
  for (const std::string& f : stale) std::ofstream(f) << "partial";
  for (const std::string& f : kept) std::ofstream(f) << "partial";
  const std::string link = path_ + ".tmp." + dead + ".link";
  fs::create_symlink(kept[1], link);
  auto file = AtomicFile::create(path_);
  for (const std::string& f : stale) EXPECT_FALSE(fs::exists(f)) << f;
  for (const std::string& f : kept) EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_TRUE(fs::is_symlink(link));
  file->write(as_bytes(std::string("new")));
  file->commit();
  EXPECT_EQ(read_file(path_), "new");

  // A directory output's hidden temporary, the same way.
  const fs::path out_dir = dir_ / "shards";
  const fs::path stale_dir = dir_ / (".shards.tmp." + dead + ".12345");
  const fs::path live_dir = dir_ / (".shards.tmp." + alive + ".12345");
  fs::create_directories(stale_dir / "sub");
  fs::create_directories(live_dir);
  std::ofstream(stale_dir / "sub" / "model.safetensors") << "partial";
  auto d = detail::AtomicDirectory::create(out_dir.string());
  EXPECT_FALSE(fs::exists(stale_dir));
  EXPECT_TRUE(fs::exists(live_dir));
}

// A write that cannot fit is refused before its first byte, naming the folder and both numbers.
TEST_F(AtomicFileTest, AWriteThatCannotFitIsRefusedWithBothNumbers) {
  EXPECT_EQ(detail::folder_holding("a/b/out.pt"), "a/b");
  EXPECT_EQ(detail::folder_holding("out/"), ".");
  EXPECT_EQ(detail::folder_holding("/out"), "/");
  EXPECT_EQ(detail::folder_holding("out.pt"), ".");
  EXPECT_NO_THROW(detail::require_free_space(path_, 1, "saving"));
  const uint64_t exabyte = uint64_t{1} << 60;
  try {
    detail::require_free_space(path_, exabyte, "converting \"in\"");
    FAIL() << "an exabyte fits";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
    const std::string m = e.what();
    EXPECT_NE(m.find("converting \"in\": the output needs at least " + std::to_string(exabyte) +
                     " bytes, but the file system of \"" + dir_.string() + "\" has "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(" bytes free; nothing was written"), std::string::npos) << m;
  }
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(AtomicFileTest, NoCommitRemovesTheTemporaryAndKeepsTheOldFile) {
  write_old("old");
  {
    auto f = AtomicFile::create(path_);
    f->write(as_bytes("new content"));
  }
  EXPECT_EQ(read_file(path_), "old");
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(AtomicFileTest, CommitReplacesAndKeepsTheMode) {
  write_old("old");
  ASSERT_EQ(::chmod(path_.c_str(), 0600), 0);
  auto f = AtomicFile::create(path_);
  f->write(as_bytes("new"));
  f->commit();
  EXPECT_EQ(read_file(path_), "new");
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(AtomicFileTest, EmptyFileCommits) {
  auto f = AtomicFile::create(path_);
  f->commit();
  EXPECT_TRUE(fs::exists(path_));
  EXPECT_EQ(fs::file_size(path_), 0u);
}

TEST_F(AtomicFileTest, WriteOrCommitAfterCommitIsAnError) {
  auto f = AtomicFile::create(path_);
  f->commit();
  EXPECT_THROW(f->write(as_bytes("x")), Error);
  EXPECT_THROW(f->commit(), Error);
  EXPECT_EQ(fs::file_size(path_), 0u);
}

TEST_F(AtomicFileTest, MissingFolderIsAnIoErrorNamingThePath) {
  std::string path = (dir_ / "no" / "such" / "out.bin").string();
  try {
    AtomicFile::create(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::IoError);
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(std::strerror(ENOENT)), std::string::npos) << e.message();
  }
}

TEST_F(AtomicFileTest, LargeWritesArriveWhole) {
  std::string big(24 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  auto f = AtomicFile::create(path_);
  f->write(as_bytes(big));
  f->commit();
  EXPECT_EQ(read_file(path_), big);
}

// Makes one step of AtomicFile::commit fail with `err`; the other steps are the real calls.
class FailingCommitCalls : public detail::CommitCalls {
 public:
  enum class Step { Flush, Close, Rename, FlushFolder };
  FailingCommitCalls(Step step, int err) : step_(step), err_(err) {}
  int flush(int fd) override {
    return step_ == Step::Flush ? err_ : detail::CommitCalls::flush(fd);
  }
  int close(int fd) override {
    const int real =
        detail::CommitCalls::close(fd);  // Linux closes the descriptor even when close fails
    return step_ == Step::Close ? err_ : real;
  }
  int rename(const std::string& from, const std::string& to) override {
    return step_ == Step::Rename ? err_ : detail::CommitCalls::rename(from, to);
  }
  int flush_folder(const std::string& folder) noexcept override {
    return step_ == Step::FlushFolder ? err_ : detail::CommitCalls::flush_folder(folder);
  }

 private:
  Step step_;
  int err_;
};

// Up to the rename, a failing step is an IoError naming the file, the step and the OS error; the
// old file stays and the temporary goes.
TEST_F(AtomicFileTest, CommitStepFailingBeforeTheRenameThrowsAndKeepsTheOldFile) {
  using Step = FailingCommitCalls::Step;
  const std::pair<Step, std::string> steps[] = {
      {Step::Flush, "flushing"}, {Step::Close, "closing"}, {Step::Rename, "renaming"}};
  for (const auto& [step, verb] : steps) {
    SCOPED_TRACE(verb);
    write_old("old");
    FailingCommitCalls calls(step, EIO);
    {
      auto f = detail::create_atomic_file(path_, calls);
      f->write(as_bytes("new"));
      try {
        f->commit();
        FAIL() << "no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::IoError);
        const std::string tail = step == Step::Rename ? " over it: " : ": ";
        EXPECT_EQ(e.message(), "saving " + grouplin::quote(path_) + ": " + verb + " " +
                                   grouplin::quote(f->temp_path()) + tail + std::strerror(EIO));
      }
      EXPECT_EQ(f->folder_flush_error(), "");
    }
    EXPECT_EQ(read_file(path_), "old");
    EXPECT_TRUE(temporaries().empty());
  }
}

// Regression test for commit() throwing after its commit point: it renamed the temporary file into
// place, then threw IoError when the folder could not be flushed, so a caller believed the old
// file was still there. Once renamed, the file is committed: commit() returns, and the failure
// is kept in folder_flush_error().
TEST_F(AtomicFileTest, FolderFlushFailingAfterTheRenameDoesNotThrow) {
  write_old("old");
  FailingCommitCalls calls(FailingCommitCalls::Step::FlushFolder, EIO);
  auto f = detail::create_atomic_file(path_, calls);
  f->write(as_bytes("new"));
  EXPECT_NO_THROW(f->commit());
  EXPECT_EQ(read_file(path_), "new");
  EXPECT_TRUE(temporaries().empty());
  EXPECT_EQ(f->folder_flush_error(),
            "saving " + grouplin::quote(path_) +
                ": the file is in place, but flushing its folder " +
                grouplin::quote(dir_.string()) + " failed: " + std::strerror(EIO) +
                " (a crash soon after may bring back the old directory entry)");
  EXPECT_THROW(f->commit(), Error);  // committed once: a second commit is still refused
  EXPECT_EQ(read_file(path_), "new");
}

TEST_F(AtomicFileTest, FolderFlushErrorIsEmptyAfterARealCommit) {
  auto f = AtomicFile::create(path_);
  f->write(as_bytes("x"));
  f->commit();
  EXPECT_EQ(f->folder_flush_error(), "");
}

// A short write (the file size limit cuts the first write) is continued, and the failure of the
// next write is an IoError with the position and the OS error. Runs in a child because the limit
// is per process.
TEST_F(AtomicFileTest, ShortWriteThenFailureIsReported) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int status = 1;
    try {
      auto f = AtomicFile::create(path_);
      f->write(as_bytes(std::string(10000, 'x')));
    } catch (const Error& e) {
      bool ok = e.code() == ErrorCode::IoError &&
                e.message().find("at byte 4096") != std::string::npos &&
                e.message().find(std::strerror(EFBIG)) != std::string::npos;
      status = ok ? 0 : 2;
    }
    ::_exit(status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(temporaries().empty());  // the child's AtomicFile removed its temporary
}

// A sink that forwards to another and fails (or stops) after `limit` bytes.
class StoppingSink : public FileSink {
 public:
  StoppingSink(FileSink& inner, uint64_t limit, bool throw_at_limit, int notify_fd = -1)
      : inner_(inner), limit_(limit), throw_(throw_at_limit), notify_fd_(notify_fd) {}
  void write(std::span<const std::byte> bytes) override {
    if (inner_.position() >= limit_) {
      if (throw_) throw Error(ErrorCode::IoError, "injected failure");
      char c = 'x';
      if (::write(notify_fd_, &c, 1) != 1) ::_exit(3);
      for (;;) ::pause();  // wait for SIGKILL
    }
    inner_.write(bytes);
  }
  uint64_t position() const override { return inner_.position(); }
  void commit() override { inner_.commit(); }

 private:
  FileSink& inner_;
  uint64_t limit_;
  bool throw_;
  int notify_fd_;
};

StateDict make_big_state(int tensors, int64_t floats_each, float value) {
  StateDict sd;
  for (int i = 0; i < tensors; ++i) {
    std::vector<float> v(static_cast<size_t>(floats_each), value + static_cast<float>(i));
    sd.insert("layer" + std::to_string(i) + ".weight", Tensor::from_f32({floats_each}, v));
  }
  return sd;
}

TEST_F(AtomicFileTest, SinkFailingMidwayKeepsOldFileAndRemovesTemporary) {
  StateDict old_sd = make_big_state(2, 1000, 1.0f);
  save_safetensors(path_, old_sd);
  std::string old_bytes = read_file(path_);
  StateDict new_sd = make_big_state(8, 100000, 5.0f);
  try {
    auto file = AtomicFile::create(path_);
    StoppingSink sink(*file, 1 << 20, /*throw_at_limit=*/true);
    write_safetensors(sink, new_sd);
    sink.commit();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "injected failure");
  }
  EXPECT_EQ(read_file(path_), old_bytes);
  EXPECT_TRUE(temporaries().empty());
}

// Regression guard for crash safety: a process SIGKILLed in the middle of saving over an existing
// file leaves the old file whole under the final name (the partial data is only in a temporary).
TEST_F(AtomicFileTest, KilledMidSaveLeavesOldFileIntact) {
  StateDict old_sd = make_big_state(2, 1000, 1.0f);
  save_safetensors(path_, old_sd);
  std::string old_bytes = read_file(path_);

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    StateDict new_sd = make_big_state(8, 1 << 20, 5.0f);  // 32 MiB
    auto file = AtomicFile::create(path_);
    StoppingSink sink(*file, 12 << 20, /*throw_at_limit=*/false, fds[1]);
    write_safetensors(sink, new_sd);
    ::_exit(4);  // not reached: the sink waits for the kill
  }
  ::close(fds[1]);
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);  // the child has written >= 12 MiB of the new file
  ::close(fds[0]);
  std::vector<std::string> temps = temporaries();
  ASSERT_EQ(temps.size(), 1u);
  EXPECT_GE(fs::file_size(temps[0]), uint64_t{12} << 20);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(read_file(path_), old_bytes);
  SafetensorsFile loaded = load_safetensors(path_);
  EXPECT_TRUE(loaded.tensors.at("layer1.weight").bit_equal(old_sd.at("layer1.weight")));
}

// The same with no synchronisation: save_safetensors itself, killed at whatever point it reached.
// The final name must hold either the old file or the complete new one, never a partial file.
TEST_F(AtomicFileTest, KilledAtAnyPointLeavesOldOrNewFile) {
  StateDict old_sd = make_big_state(1, 10, 1.0f);
  save_safetensors(path_, old_sd);
  std::string old_bytes = read_file(path_);
  StateDict new_sd = make_big_state(4, 4 << 20, 5.0f);  // 64 MiB
  for (int delay_ms : {0, 5, 20}) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      save_safetensors(path_, new_sd);
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    std::string now = read_file(path_);
    if (now != old_bytes) {
      SafetensorsFile loaded = load_safetensors(path_);
      ASSERT_EQ(loaded.tensors.size(), 4u);
      EXPECT_TRUE(loaded.tensors.at("layer3.weight").bit_equal(new_sd.at("layer3.weight")));
      save_safetensors(path_, old_sd);  // back to the old file for the next round
    }
    for (const std::string& t : temporaries()) fs::remove(t);
  }
}

}  // namespace
}  // namespace grouplin
