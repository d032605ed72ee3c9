// Private: what a writer killed outright (SIGKILL, a power loss) left beside its output, found
// and removed by the next writer of the same output.
//
//   grouplin::detail::remove_stale_temporaries("/data", "model.safetensors", TempKind::File);
//
// AtomicFile and AtomicDirectory name their temporaries STEM.tmp.<pid>.<random> (a directory's
// hidden: ".out.tmp.<pid>.<n>"). Ctrl-C, SIGTERM and every error remove them; a process killed
// without a chance to run anything cannot. A temporary of the same output whose pid is no running
// process is such a leftover: removed before the new one is made. One whose pid runs (another
// conversion to the same output, or a reused pid) is left alone.
#pragma once

#include <filesystem>
#include <string>

namespace grouplin::detail {

enum class TempKind {
  File,       // a regular file (not through a link)
  Directory,  // a directory (not through a link), removed with all it holds
};

// Removes each entry of `folder` named `stem` + ".tmp." + <pid> + "." + <letters and digits>, of
// `kind`, whose pid is no running process. Never throws: what cannot be removed stays.
void remove_stale_temporaries(const std::filesystem::path& folder, const std::string& stem,
                              TempKind kind) noexcept;

}  // namespace grouplin::detail
