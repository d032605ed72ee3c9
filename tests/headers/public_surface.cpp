// What the umbrella header leaves out: names only GroupLin's own code and tests use. Each alias
// below conflicts with a class or function of the same name in grouplin.hpp, so a name that comes
// back into the public surface breaks this build.
// Regression: grouplin.hpp exposed the test hook CommitCalls (AtomicFile's commit steps) and the
// test counters StorageStats / storage_stats(), with no promise behind them.
#include "grouplin/grouplin.hpp"

namespace grouplin {
using CommitCalls = void;
using StorageStats = void;
using storage_stats = void;
}  // namespace grouplin
