// The two-thread copy pipeline of conversions (see io/tensor_stream.hpp).
#include "io/operations/tensor_stream.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#include "grouplin/error.hpp"
#include "io/formats/zip.hpp"
#include "layout/planned_reader.hpp"
#include "layout/planned_tensor.hpp"

namespace grouplin::detail {
namespace {

constexpr size_t kPage = 4096;

}  // namespace

void TensorStream::FreeAligned::operator()(std::byte* p) const {
  ::operator delete(p, std::align_val_t(kPage));
}

TensorStream::TensorStream(const CheckpointSource& src, std::span<const PlannedTensor> tensors,
                           std::vector<size_t> order,
                           std::optional<std::vector<uint64_t>> out_offsets, bool crc)
    : src_(src),
      tensors_(tensors),
      order_(std::move(order)),
      out_offsets_(std::move(out_offsets)),
      want_crc_(crc),
      crcs_(tensors.size(), 0),
      slots_(kSlots) {
  if (out_offsets_ && out_offsets_->size() != order_.size()) {
    throw Error(ErrorCode::InvalidArgument, "TensorStream: one output offset per tensor needed");
  }
  for (Slot& s : slots_) {
    s.buffer.reset(static_cast<std::byte*>(::operator new(kChunk, std::align_val_t(kPage))));
  }
  reader_ = std::thread([this] { read_all(); });
}

TensorStream::~TensorStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  reader_.join();
}

TensorStream::Slot* TensorStream::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return stop_ || filled_ - drained_ < kSlots; });
  return stop_ ? nullptr : &slots_[filled_ % kSlots];
}

void TensorStream::publish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++filled_;
  }
  changed_.notify_all();
}

void TensorStream::read_all() {
  try {
    Slot* slot = nullptr;  // the slot being filled, if any
    uint64_t pos = 0;      // output offset of the next byte (relative to the tensor if unknown)
    for (size_t i = 0; i < order_.size(); ++i) {
      const size_t k = order_[i];
      const uint64_t start = out_offsets_ ? (*out_offsets_)[i] : 0;
      if (slot != nullptr && (!out_offsets_ || start != pos)) {  // not adjacent: new chunk
        publish();
        slot = nullptr;
      }
      pos = start;
      uint32_t crc = 0;
      layout::PlannedReader reader(src_, tensors_[k]);
      while (reader.left() > 0) {
        if (slot == nullptr) {
          if ((slot = acquire()) == nullptr) return;
          // Same address as the output offset modulo the page size (and the chunk).
          slot->begin = slot->end = static_cast<size_t>(pos % kChunk);
        }
        const uint64_t room = kChunk - slot->end;
        const size_t len = static_cast<size_t>(std::min(room, reader.left()));
        const std::span<std::byte> dst(slot->buffer.get() + slot->end, len);
        reader.read(dst);
        if (want_crc_) crc = zip::crc32(crc, dst);
        slot->end += len;
        pos += len;
        // Set before the slot holding the tensor's end is published: drain() may then read it.
        if (reader.left() == 0) crcs_[k] = crc;
        if (slot->end == kChunk) {
          publish();
          slot = nullptr;
        }
      }
    }
    if (slot != nullptr) publish();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    changed_.notify_all();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

void TensorStream::drain(uint64_t n, const std::function<void(std::span<const std::byte>)>& write) {
  while (n > 0) {
    const Slot* slot = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return filled_ > drained_ || error_ || done_; });
      if (filled_ == drained_) {
        if (error_) std::rethrow_exception(error_);
        throw Error(ErrorCode::InvalidArgument, "TensorStream: drained past the end");
      }
      slot = &slots_[drained_ % kSlots];
    }
    const size_t from = slot->begin + drained_part_;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(n, slot->end - from));
    write(std::span<const std::byte>(slot->buffer.get() + from, len));
    n -= len;
    if (from + len < slot->end) {
      drained_part_ += len;
      continue;  // n is 0: the rest of this slot goes to the next drain()
    }
    drained_part_ = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++drained_;
    }
    changed_.notify_all();
  }
}

}  // namespace grouplin::detail
