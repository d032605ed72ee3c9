// Private: the one executor of a plan: the bytes of one planned tensor, front to back, from where
// its pieces' bytes live: the files of a checkpoint (CheckpointSource, pread: what a conversion
// writes and what verify compares) or memory (MemoryPieces: PlannedTensor::copy_to, what
// load_state_dict copies).
//
//   layout::PlannedReader r(src, plan.tensors[k]);
//   while (r.left() > 0) r.read(std::span(buffer.data(), std::min(buffer.size(), r.left())));
//
// Plain pieces are read by the source straight into the caller's buffer. A
// rearranged tensor (transposed or interleaved experts) is read one block (one expert's matrix)
// at a time into a buffer, moved into its target form in a second one, and served from there:
// two blocks of memory, whatever the tensor's size. A dequantized tensor is read the same way, a
// few rows of one matrix at a time (whole scale blocks, about 4 MiB of values), its codes and
// their scales into buffers and the values computed into a third.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::layout {

// Where the bytes of a plan's pieces live.
class PieceSource {
 public:
  virtual ~PieceSource() = default;
  // Copies bytes [at, at + dst.size()) of `piece` into `dst`. Throws what the source's reads
  // throw. Requires: at + dst.size() <= piece.nbytes().
  virtual void read(const Tensor& piece, uint64_t at, std::span<std::byte> dst) const = 0;
  // The piece's bytes themselves when the source holds them in memory, else nullptr.
  virtual const std::byte* direct(const Tensor& piece) const {
    (void)piece;
    return nullptr;
  }
};

// Pieces whose bytes are in memory (their tensors' data): memcpy.
class MemoryPieces : public PieceSource {
 public:
  void read(const Tensor& piece, uint64_t at, std::span<std::byte> dst) const override;
  const std::byte* direct(const Tensor& piece) const override { return piece.data(); }
};

class PlannedReader {
 public:
  // `src` and `t` must outlive the reader.
  PlannedReader(const PieceSource& src, const PlannedTensor& t);

  // Bytes not read yet.
  uint64_t left() const { return total_ - done_; }
  // Fills `dst` with the next dst.size() bytes. Throws as CheckpointSource::read.
  // Requires: dst.size() <= left().
  void read(std::span<std::byte> dst);
  // Calls `fn` with all the bytes not read yet, front to back, in chunks of at most `max_bytes`
  // (whole elements): a plain tensor's pieces themselves where the source holds them in memory,
  // else bytes read into a buffer. Throws what read throws, and what `fn` throws.
  void visit(size_t max_bytes, const std::function<void(std::span<const std::byte>)>& fn);

 private:
  void read_pieces(uint64_t at, std::span<std::byte> dst);  // bytes [at, ...) of the pieces
  void read_dequantized(std::span<std::byte> dst);

  const PieceSource& src_;
  const PlannedTensor& t_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  // Rearranged tensors: the current block in stored and in target form.
  uint64_t block_bytes_ = 0;
  uint64_t block_at_ = UINT64_MAX;  // first byte of the block held in `moved_`
  std::vector<std::byte> stored_, moved_;
  // Dequantized tensors: rows per chunk, and the chunk's scales.
  int64_t chunk_rows_ = 0;
  std::vector<std::byte> scales_;
  // Plain tensors: where the next byte is among the pieces.
  size_t piece_ = 0;
  uint64_t piece_at_ = 0;
};

}  // namespace grouplin::layout
