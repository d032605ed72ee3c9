// Private: the memory for the expert block's intermediates that never leave a call (the gathered
// rows, the gate's output, their gradients). A fresh heap tensor of tens of megabytes costs its
// page faults on every call (docs/PERFORMANCE.md, measurements behind the code's comments); a
// buffer kept per calling thread costs them once.
#pragma once

#include <cstddef>
#include <memory>

#include "grouplin/storage.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::block {

// Carves tensors out of this thread's buffer, grown to at least `bytes` (kept, at its largest
// size so far, until the thread ends). While one Workspace lives on a thread, another on the
// same thread takes fresh heap tensors instead. Its tensors are views of the buffer: used after
// the Workspace is gone, they would see the next call's values.
class Workspace {
 public:
  explicit Workspace(size_t bytes);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // The next [shape] of `dtype`, contents unspecified, 64-byte aligned.
  Tensor take(const Shape& shape, DType dtype);

  // The bytes take(shape, dtype) uses, alignment included.
  static size_t bytes_for(const Shape& shape, DType dtype);

 private:
  std::shared_ptr<Storage> storage_;  // null: this thread's buffer is in use, heap tensors instead
  size_t used_ = 0;
};

}  // namespace grouplin::block
