// Private: refusing a write that cannot fit before its first byte (convert checks its output's
// file system once the size of what it will write is known).
//
//   grouplin::detail::require_free_space("out/model.safetensors", 16'000'000'000, context);
#pragma once

#include <cstdint>
#include <string>

namespace grouplin::detail {

// The folder that holds `path` ("." for a bare name; "out/" is the folder "out", held by ".").
std::string folder_holding(const std::string& path);

// Throws Error(IoError) naming `context`, the folder that will hold `path` and both numbers when
// its file system has fewer than `bytes` bytes free for this user (statvfs: f_bavail x
// f_frsize). Does nothing when the folder's file system cannot be asked (the write then fails, or
// not, as it will).
void require_free_space(const std::string& path, uint64_t bytes, const std::string& context);

}  // namespace grouplin::detail
