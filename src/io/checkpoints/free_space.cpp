#include "io/checkpoints/free_space.hpp"

#include <sys/statvfs.h>

#include "grouplin/error.hpp"

namespace grouplin::detail {

std::string folder_holding(const std::string& path) {
  const size_t end = path.find_last_not_of('/');  // "out/" is the folder "out"
  const size_t slash = end == std::string::npos ? std::string::npos : path.rfind('/', end);
  if (slash == std::string::npos) return ".";
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

void require_free_space(const std::string& path, uint64_t bytes, const std::string& context) {
  const std::string folder = folder_holding(path);
  struct statvfs fs;
  if (::statvfs(folder.c_str(), &fs) != 0) return;
  const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_frsize);
  if (free >= bytes) return;
  throw Error(ErrorCode::IoError, context + ": the output needs at least " + std::to_string(bytes) +
                                      " bytes, but the file system of " + quote(folder) + " has " +
                                      std::to_string(free) + " bytes free; nothing was written");
}

}  // namespace grouplin::detail
