// Runs the built `grouplin` in a child process for the end-to-end tests: exit code, outputs and
// the child's peak resident set.
//
//   CliRun r = run_cli(dir, {"inspect", "model.pt"});
//   EXPECT_EQ(r.code, 0) << r.err;
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "temp_dir_test.hpp"

namespace grouplin {

// Peak resident-set tests skip under AddressSanitizer (GCC and clang spell the check apart).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAddressSanitizer = true;
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
  long max_rss_kib = 0;  // peak resident set of the child (getrusage)
};

// In a forked child: becomes the CLI with `args` (exit 127 if it cannot).
[[noreturn]] inline void exec_cli(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  static std::string cli = GROUPLIN_CLI;
  argv.push_back(cli.data());
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(cli.c_str(), argv.data());
  ::_exit(127);
}

// Runs the CLI with `args`; stdout and stderr go to files in `dir` (not a terminal: no progress
// bar). A child killed by a signal fails the calling test. ru_maxrss carries over fork and exec,
// so the calling process must itself stay small for max_rss_kib to mean the CLI's own peak.
// `env` holds "NAME=VALUE" settings for the child's environment.
inline CliRun run_cli(const std::filesystem::path& dir, const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {}) {
  const std::string out = (dir / ".stdout").string(), err = (dir / ".stderr").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    for (const std::string& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    exec_cli(args);
  }
  CliRun r;
  int status = 0;
  struct rusage usage = {};
  ::wait4(pid, &status, 0, &usage);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.max_rss_kib = usage.ru_maxrss;
  r.out = test_files::read_all(out);
  r.err = test_files::read_all(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

// Runs the CLI with `args`, its stderr a terminal (a pseudo-terminal whose output is returned in
// `err`; stdout goes to a file, in `out`): what a user at a terminal sees, progress bars included.
inline CliRun run_cli_on_terminal(const std::filesystem::path& dir,
                                  const std::vector<std::string>& args) {
  const std::string out = (dir / ".stdout").string();
  int master = -1;
  pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    exec_cli(args);
  }
  CliRun r;
  char buf[4096];
  for (;;) {  // until the child closes the terminal (EIO once it has exited)
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    r.err.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = test_files::read_all(out);
  std::filesystem::remove(out);
  return r;
}

}  // namespace grouplin
