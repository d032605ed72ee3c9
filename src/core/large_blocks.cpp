#include "core/large_blocks.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace grouplin::detail {
namespace {

struct Kept {
  void* block;
  size_t bytes;
};

// Never destroyed: storages freed by other static or thread-local destructors at exit still
// reach it (what it keeps then is reachable, not leaked).
struct Pool {
  Pool() { kept.reserve(kMaxKeptBlocks); }  // give_back never allocates (it runs in destructors)
  std::mutex mutex;
  std::vector<Kept> kept;  // oldest first
  size_t kept_bytes = 0;
};
Pool& pool() {
  static Pool* const p = new Pool;
  return *p;
}

// kMaxKeptBytes, or an eighth of the machine's memory where that is less.
size_t max_kept_bytes() {
  static const size_t limit = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return kMaxKeptBytes;
    return std::min(kMaxKeptBytes, static_cast<size_t>(pages) * static_cast<size_t>(page) / 8);
  }();
  return limit;
}

// Frees every kept block; the caller holds the pool's mutex.
size_t free_all_locked(Pool& p) {
  const size_t freed = p.kept_bytes;
  for (const Kept& k : p.kept) std::free(k.block);
  p.kept.clear();
  p.kept_bytes = 0;
  return freed;
}

}  // namespace

void* take_large_block(size_t bytes) {
  {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    for (size_t i = p.kept.size(); i-- > 0;) {  // the most recently freed first
      if (p.kept[i].bytes == bytes) {
        void* block = p.kept[i].block;
        p.kept.erase(p.kept.begin() + static_cast<std::ptrdiff_t>(i));
        p.kept_bytes -= bytes;
        return block;
      }
    }
  }
  void* block = std::aligned_alloc(kLargeBlock, bytes);
  if (block != nullptr) madvise(block, bytes, MADV_HUGEPAGE);
  return block;
}

void give_back_large_block(void* block, size_t bytes) {
  const size_t limit = max_kept_bytes();
  if (bytes > limit) {
    std::free(block);
    return;
  }
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  while (!p.kept.empty() && (p.kept_bytes + bytes > limit || p.kept.size() >= kMaxKeptBlocks)) {
    std::free(p.kept.front().block);
    p.kept_bytes -= p.kept.front().bytes;
    p.kept.erase(p.kept.begin());
  }
  p.kept.push_back({block, bytes});
  p.kept_bytes += bytes;
}

size_t release_large_blocks() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  return free_all_locked(p);
}

}  // namespace grouplin::detail
