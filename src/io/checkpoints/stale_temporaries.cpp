#include "io/checkpoints/stale_temporaries.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <string_view>
#include <system_error>

namespace grouplin::detail {
namespace {

// The pid of `name` when it is stem.tmp.<pid>.<alnum>, else 0.
pid_t temporary_pid(std::string_view name, const std::string& stem) {
  const std::string head = stem + ".tmp.";
  if (name.size() <= head.size() || name.substr(0, head.size()) != head) return 0;
  name.remove_prefix(head.size());
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 9 || dot + 1 == name.size()) return 0;
  pid_t pid = 0;
  for (char c : name.substr(0, dot)) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return 0;
    pid = pid * 10 + (c - '0');
  }
  for (char c : name.substr(dot + 1)) {
    if (!std::isalnum(static_cast<unsigned char>(c))) return 0;
  }
  return pid;
}

bool running(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

void remove_stale_temporaries(const std::filesystem::path& folder, const std::string& stem,
                              TempKind kind) noexcept {
  std::error_code ec;
  std::filesystem::directory_iterator it(folder, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const pid_t pid = temporary_pid(it->path().filename().native(), stem);
    if (pid <= 0 || pid == ::getpid() || running(pid)) continue;
    struct stat st;  // lstat: a link is never followed, nor removed
    if (::lstat(it->path().c_str(), &st) != 0) continue;
    if (kind == TempKind::File && S_ISREG(st.st_mode)) {
      ::unlink(it->path().c_str());
    } else if (kind == TempKind::Directory && S_ISDIR(st.st_mode)) {
      std::error_code ignored;
      std::filesystem::remove_all(it->path(), ignored);
    }
  }
}

}  // namespace grouplin::detail
