// Private: a restricted pickle machine for the data.pkl record of PyTorch `.pt` files.
//
//   grouplin::pickle::PickledStateDict p = grouplin::pickle::run_pickle(pkl_bytes);
//   for (const auto& [name, t] : p.tensors) {
//     const grouplin::pickle::StorageRef& s = p.storages[t.storage];  // record data/<s.key>
//   }
//
// It understands only the opcodes PyTorch's weights_only loader allows, and only the globals
// needed for state dicts (collections.OrderedDict, torch._utils._rebuild_tensor_v2/_v3,
// torch._utils._rebuild_parameter, torch.<Type>Storage, torch.UntypedStorage, torch dtypes).
// Nothing is imported or called: a global is a tag, and REDUCE on an allowed tag builds the
// value here in C++. Every size is bounded (PickleLimits), and so is all the memory the machine
// holds. Errors start with "offset N: ", the offset of the opcode in the pickle; callers add the
// file and record names. The machine is five files: this run loop (pickle_machine.cpp), the
// opcode names (pickle_opcodes.cpp), the values with their memory budget (pickle_values.cpp),
// what torch's globals build (pickle_torch.cpp; the allowed globals: pickle_globals.hpp), and
// TransformerEngine's FP8 tensors (pickle_te.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grouplin/dtype.hpp"
#include "grouplin/error.hpp"
#include "grouplin/tensor.hpp"

namespace grouplin::pickle {

// Caps on what one pickle may make the machine hold. Exceeding one throws
// Error(PickleLimitExceeded) naming the limit. The defaults are far above what torch.save
// writes for the largest state dicts (about 10 objects and 100 bytes of pickle per tensor;
// torch batches SETITEMS by 1000, so its stack stays under ~2000 values).
struct PickleLimits {
  size_t max_bytes = size_t{256} << 20;  // size of the pickle itself
  size_t max_stack = size_t{1} << 20;    // values on the stack, all MARK levels together
  size_t max_marks = 256;                // MARKs open at once
  size_t max_memo = size_t{1} << 24;     // distinct memo keys
  size_t max_objects = size_t{1} << 26;  // values created (each opcode creates at most one)
  size_t max_string = size_t{1} << 16;   // bytes in one string or GLOBAL line
  size_t max_depth = 256;                // containers inside containers
  size_t max_rank = 64;                  // dimensions of one tensor
  // Memory the machine may hold, values, memo, dict keys, storages, tensors and the result
  // together (vector capacities, hash-map nodes): memory_base + memory_per_byte x the pickle's
  // size. torch.save's state-dict pickles need about 10 bytes per byte (measured: 9.6 for
  // 100,000 tensors in 13.6 MB of pickle, 10.4 for 20,000); a pickle that builds more from less
  // (one large value referenced again and again) is refused as soon as it passes the budget.
  // `grouplin inspect` then stays under 64 MiB + 16 x the pickle's size in all (tested).
  size_t memory_base = size_t{16} << 20;
  size_t memory_per_byte = 16;
  // Work the machine may do, in steps: an opcode, a value visited or copied, 8 bytes of a string
  // checked, hashed or copied, beyond reading the pickle once: work_base + work_per_byte x the
  // pickle's size. Memory alone did not bound time: a memoized rank-64 tensor rebuilt for 6
  // bytes of pickle at a time, or listed under thousands of names, holds little but visits 130
  // values per rebuild or name (136 KB of such pickle took 3.6 s and 8.1 s under
  // AddressSanitizer in the .pt fuzzer). Measured, in steps per byte of pickle: torch.save's
  // state dicts 0.67-0.99 (18k BF16 experts, 2.5 MB: 0.69; a 2000-layer module: 0.79), rank-8
  // tensors 1.36; the amplifiers 0.2-1.5, but 10-11 for one tensor under many names and 44 for
  // rebuilt rank-64 tensors. 8 per byte leaves real files 6x of room and refuses those two once
  // they pass 1 Mi steps + 8x; a step costs about 20 ns in a release build (1 Mi steps: 20 ms).
  // Past the budget: Error(PickleLimitExceeded), "work on ... past N steps".
  size_t work_base = size_t{1} << 20;
  size_t work_per_byte = 8;
};
// A storage named by a persistent id ('storage', torch.<Type>Storage, key, location, numel).
struct StorageRef {
  std::string key;       // its bytes are the record <folder>/data/<key>
  std::string type;      // "torch.FloatStorage", "torch.UntypedStorage", ...
  DType dtype;           // element type (U8 for UntypedStorage)
  bool untyped;          // torch.UntypedStorage: numel counts bytes
  int64_t numel;         // elements of dtype
  std::string location;  // "cpu", "cuda:0", ... (informational; everything loads to memory)
  size_t nbytes() const { return static_cast<size_t>(numel) * dtype_size(dtype); }
};

// A tensor built by _rebuild_tensor_v2/_v3. Its elements lie inside its storage (checked).
struct TensorRef {
  size_t storage = 0;          // index into PickledStateDict::storages
  DType dtype = DType::F32;    // the storage's type (v2) or the explicit dtype (v3)
  int64_t storage_offset = 0;  // in elements of dtype
  Shape shape;
  std::vector<int64_t> stride;  // in elements of dtype, all >= 0
  // MX scales TransformerEngine stored swizzled for its GEMM (with_gemm_swizzled_scales): the
  // padded [rows, mx_padded_cols] bytes at storage_offset are in cuBLAS's 128 x 4 tiles, and the
  // tensor is the [shape[0], shape[1]] top-left corner of them in row-major order (pt_reader
  // unswizzles it: a permutation).
  bool mx_swizzled = false;
  int64_t mx_padded_cols = 0;
};

// The top-level dict of a state dict pickle.
struct PickledStateDict {
  std::vector<std::pair<std::string, TensorRef>> tensors;  // in the dict's order
  std::vector<StorageRef> storages;                        // in order of first reference
  std::vector<Problem> notes;  // what was left out on purpose (PtReadOptions::notes)
};

// Runs the pickle and returns its top-level dict (collections.OrderedDict or dict) of
// name -> tensor. `_metadata` set by BUILD on the OrderedDict is read and ignored.
// Throws Error: ForbiddenOpcode (any opcode outside the allowed set), ForbiddenGlobal (any
// global outside the allow-list), UnsupportedDType (known torch types GroupLin cannot hold:
// complex, quantized, fnuz float8), PickleStackError (stack underflow, missing MARK),
// PickleLimitExceeded, Truncated (an argument or the pickle ends early), InvalidPickle (wrong
// types: SETITEM on a non-dict, APPEND on a non-list, a malformed persistent id, a top-level
// value that is not a dict of tensors, bytes after STOP, ...), DuplicateName (a dict key set
// twice), StorageTooSmall (a tensor reaching past its storage), SizeOverflow. A training
// checkpoint's state dict is the one inner dict of tensors, or the one under `state_dict_key`
// (PtReadOptions::state_dict_key): MissingKey when there is no such dict, SeveralStateDicts when
// several hold tensors and no key names one.
PickledStateDict run_pickle(std::span<const std::byte> pickle, const PickleLimits& limits = {},
                            std::string_view state_dict_key = {});

// True when `stride` is row-major contiguous for `shape`; dimensions of size 1, and tensors
// with no elements, may have any stride (as in torch's is_contiguous).
bool is_contiguous(const Shape& shape, const std::vector<int64_t>& stride);

}  // namespace grouplin::pickle
