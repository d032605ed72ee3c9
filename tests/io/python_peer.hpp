// Test helper: runs a Python test peer (a script under tests/, with the project's .venv Python
// that has PyTorch, safetensors and ml_dtypes) and collects what it prints.
//
//   std::string output;
//   int rc = grouplin::test_io::run_python_peer("tests/io/hf_shards_peer.py", "make d qwen",
//   output); EXPECT_EQ(rc, 0) << output;
#pragma once

#include <stdio.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace grouplin::test_io {

// Runs `script` (relative to the source tree) with `args`; returns its exit status (-1 when it
// could not run or was killed) and puts its stdout and stderr in `output`.
inline int run_python_peer(const std::string& script, const std::string& args,
                           std::string& output) {
  const std::string cmd = std::string(GROUPLIN_PYTHON) + " " + GROUPLIN_SOURCE_DIR + "/" + script +
                          " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    output = "popen failed: " + std::string(std::strerror(errno));
    return -1;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace grouplin::test_io
