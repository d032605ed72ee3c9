// Private to Storage: the memory of large owned storages, kept for a while after they are freed
// so that the next storage of the same size takes it instead of fresh pages.
//
//   void* p = take_large_block(bytes);      // a kept block of exactly `bytes`, or fresh memory
//   give_back_large_block(p, bytes);        // kept (or freed, past the limits)
//
// Why: fresh memory from the OS is cleared page by page at first touch. An output written whole
// every step (a layer's weight gradients: E x out x in values per call) paid that clearing on
// every call (docs/PERFORMANCE.md, issue 43). Blocks are only handed out again at exactly their
// size (sizes are whole huge pages); what is kept is bounded (kMaxKeptBytes, at most an eighth of
// the machine's memory) and freed by release_large_blocks (Storage::release_kept_memory).
#pragma once

#include <cstddef>

namespace grouplin::detail {

// Blocks of at least this many bytes (whole huge pages, 2 MiB aligned) are kept.
inline constexpr size_t kLargeBlock = size_t{2} << 20;
// At most this many bytes (or an eighth of the machine's memory, where less) are kept, in at
// most kMaxKeptBlocks blocks; the oldest go first.
inline constexpr size_t kMaxKeptBytes = size_t{4} << 30;
inline constexpr size_t kMaxKeptBlocks = 64;

// A block of `bytes` (a multiple of kLargeBlock), 2 MiB aligned and advised for transparent huge
// pages: a kept one of that size (its bytes are what they were), or new memory. Null when the
// system has none.
void* take_large_block(size_t bytes);
// Keeps `block` (from take_large_block(bytes)) for a later request, or frees it.
void give_back_large_block(void* block, size_t bytes);
// Frees every kept block; returns the bytes freed.
size_t release_large_blocks();

}  // namespace grouplin::detail
