// Private: the bytes of planned tensors, read on a second thread while the caller writes them.
//
//   grouplin::detail::TensorStream stream(src, plan.tensors, order, out_offsets, /*crc=*/true);
//   stream.drain(bytes_of_the_first_tensors, [&](std::span<const std::byte> b) { sink.write(b); });
//   uint32_t crc = stream.crc(k);   // CRC-32 of tensor k, once its bytes have been drained
//
// A reader thread walks the tensors in `order`, piece by piece, and fills a ring of kSlots
// buffers of kChunk bytes (pread from the input file, or memcpy for pieces the input's reader
// holds in memory), computing each tensor's CRC-32 on the way if asked; the calling thread
// drains the ring in the same order. When the output offsets of the tensors are known, chunks
// are cut on the output file's kChunk grid (a chunk may then hold the end of one tensor and the
// start of the next, when they are adjacent in the output) and each buffer sits at the same
// address modulo 4 KiB as its bytes in the output: the writes are then whole, aligned 256 KiB
// blocks.
//
// Measured on the dev machine (2 cores, 1 GiB, page cache warm, copy time without fsync, median
// of 7-11): copy_file_range as cp does it (input and output offsets equal modulo 4 KiB) 0.26 s,
// copy_file_range between offsets that differ modulo 4 KiB (most tensors of a converted file)
// 0.41 s, one thread doing pread + write 0.30 s, this pipeline 0.20 s with writes aligned on the
// output's 256 KiB grid, 0.27 s with writes off the page grid but buffers aligned with the output
// modulo 64 bytes, 0.30 s with neither. The CRC on the reader thread costs nothing measurable.
// Buffers of 128 KiB x 8 gave 0.22 s, of 512 KiB x 4 0.67 s (the L2 cache no longer holds a
// buffer between its read and its write). The buffers total 1 MiB: all the anonymous memory a
// conversion needs for tensor data.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "io/checkpoints/checkpoint_source.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::detail {

class TensorStream {
 public:
  static constexpr size_t kChunk = size_t{256} << 10;
  static constexpr size_t kSlots = 4;

  // Starts the reader thread. `src` and `tensors` must outlive the stream. `order` lists the
  // indices into `tensors` in the order their bytes will be drained. `out_offsets`, if given,
  // holds the output file offset of each tensor of `order` (same positions), increasing.
  TensorStream(const CheckpointSource& src, std::span<const PlannedTensor> tensors,
               std::vector<size_t> order, std::optional<std::vector<uint64_t>> out_offsets,
               bool crc);
  // Stops and joins the reader (also when draining was abandoned midway).
  ~TensorStream();
  TensorStream(const TensorStream&) = delete;
  TensorStream& operator=(const TensorStream&) = delete;

  // Passes the next `n` bytes of the stream to `write`, in pieces of at most kChunk bytes, on the
  // calling thread. Rethrows the reader's error (Error(IoError), Error(Truncated)) and whatever
  // `write` throws. Requires: n does not go past the end of the stream.
  void drain(uint64_t n, const std::function<void(std::span<const std::byte>)>& write);
  // CRC-32 of tensor `k` (an index into `tensors`). Requires: crc was requested and every byte
  // of tensor k has been drained.
  uint32_t crc(size_t k) const { return crcs_[k]; }

 private:
  struct FreeAligned {
    void operator()(std::byte* p) const;
  };
  struct Slot {
    std::unique_ptr<std::byte, FreeAligned> buffer;  // kChunk bytes, 4 KiB-aligned
    size_t begin = 0;                                // the bytes are [begin, end) of buffer
    size_t end = 0;
  };

  void read_all();
  // Waits for a free slot; nullptr when stopping.
  Slot* acquire();
  void publish();

  const CheckpointSource& src_;
  std::span<const PlannedTensor> tensors_;
  std::vector<size_t> order_;
  std::optional<std::vector<uint64_t>> out_offsets_;
  bool want_crc_;
  std::vector<uint32_t> crcs_;  // written by the reader before the slot holding the end of the
                                // tensor is published
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t filled_ = 0;      // slots published by the reader, in all
  uint64_t drained_ = 0;     // slots fully drained by the caller, in all
  size_t drained_part_ = 0;  // bytes of slot `drained_` already drained
  bool done_ = false;        // the reader has published everything
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread reader_;  // started by the constructor once everything above exists
};

}  // namespace grouplin::detail
