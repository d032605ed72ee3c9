// PyTorch `.pt` checkpoints (the zip files of torch.save), read and written without executing
// anything from the file.
//
//   grouplin::StateDict sd = grouplin::load_pt("model.pt");   // zero-copy views of the mapping
//   const grouplin::Tensor& w = sd.at("decoder.fc1.weight0");
//   grouplin::save_pt("copy.pt", sd);   // torch.load("copy.pt", weights_only=True) reads it
//
// What is accepted and refused is described in docs/pt-format.md: stored zip records only, a
// restricted pickle machine (the opcodes of torch's weights_only loader, only the globals that
// rebuild tensors and ordered dicts), storage records whose size matches exactly, tensors inside
// their storage. Tensors that share a storage in the file share bytes after loading.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grouplin/error.hpp"
#include "grouplin/file.hpp"
#include "grouplin/state_dict.hpp"
#include "grouplin/storage.hpp"

namespace grouplin {

struct PtReadOptions {
  // CRC-32 of data.pkl and the other small records (byteorder, version): always worth it.
  bool check_record_crc = true;
  // CRC-32 of every storage record too. Off by default: it reads every byte of the file at load
  // time, at about the speed of a copy (docs/PERFORMANCE.md), which defeats zero-copy loading of
  // large checkpoints; damaged tensor bytes cannot make the reader misbehave, since every size
  // and offset is checked structurally. Callers that want end-to-end integrity (a `verify`
  // command) turn it on.
  bool check_storage_crc = false;
  // When set, receives what the reader leaves out on purpose, as warnings: the column-wise copy
  // of a TransformerEngine MXFP8Tensor (CopyDropped, naming the entry). Not owned.
  std::vector<Problem>* notes = nullptr;
  // A training checkpoint's state dict: the dict of tensors under this top-level key
  // ({"model0": sd0, "model1": sd1, ...}; Error(MissingKey) when there is none). Empty: the top
  // level, or its only dict of tensors (Error(SeveralStateDicts) for several).
  std::string state_dict_key{};
};

// Maps `path` (read-only, or copy-on-write with `mode`: MapMode) and returns its state dict in
// the file's order. Tensors are views into the mapping (which they keep alive; writable only for
// CopyOnWrite) when their record is aligned for their dtype, and non-contiguous tensors (e.g. a
// saved transpose) are copied to row-major heap tensors.
// Throws Error(IoError) if the file cannot be mapped, and the errors of parse_pt.
StateDict load_pt(const std::string& path, const PtReadOptions& options = {},
                  MapMode mode = MapMode::ReadOnly);

// Same checks and result as load_pt on bytes already in memory (`bytes` is kept alive by the
// returned tensors, which view it: writable only if `bytes` is, as safetensors' parse is).
// Error messages start with `loading "<name_for_errors>": `.
// Throws Error with: InvalidZip, Truncated, CompressedEntry, EncryptedEntry, ZipHeaderMismatch,
// DuplicateName, CrcMismatch (zip layer); MissingRecord (no data.pkl, or a storage with no
// data/<key> record); UnknownFormat (byteorder not "little"); the pickle errors ForbiddenOpcode,
// ForbiddenGlobal, PickleStackError, PickleLimitExceeded, InvalidPickle, UnsupportedDType;
// StorageSizeMismatch (record size != numel x element size); StorageTooSmall; SizeOverflow.
// Requires: bytes != nullptr.
StateDict parse_pt(std::shared_ptr<Storage> bytes, const std::string& name_for_errors,
                   const PtReadOptions& options = {});

// Writes `dict` as torch.save(OrderedDict) would, into `sink` (not committed): zip records
// "archive/data.pkl" (pickle protocol 2, _rebuild_tensor_v2 with typed storages, a `_metadata`
// BUILD with {'version': 1} for every module prefix), "archive/byteorder", "archive/data/<k>",
// "archive/version". F8_E4M3, F8_E5M2, U16, U32, U64 use _rebuild_tensor_v3 + UntypedStorage as
// PyTorch >= 2.1 does (older PyTorch cannot load those). Tensors viewing overlapping bytes of
// one storage with one dtype share one record, as in torch; all others get their own record.
// Streams tensor bytes to the sink; only the pickle is built in memory. Everything is checked
// before the first byte goes to the sink.
// Throws, with messages starting `writing .pt: tensor "<name>": ...` (the tensor when the error is
// about one): Error(UndefinedTensor) for an undefined tensor, Error(InvalidArgument) for a name
// that is not UTF-8, Error(PickleLimitExceeded) for what load_pt would refuse (a name over 65536
// bytes, more than 64 dimensions, a pickle over 256 MiB: pickle::PickleLimits), and what the sink
// throws (Error(IoError)).
void write_pt(FileSink& sink, const StateDict& dict);

// write_pt into a temporary file beside `path`, then fsync and rename over `path`: a failure
// leaves any existing file untouched and no temporary file. Throws as write_pt, every message
// starting `saving "<path>": ` instead, and Error(IoError) (creating, writing, flushing or
// renaming the temporary file; never once it is renamed, see AtomicFile::commit).
void save_pt(const std::string& path, const StateDict& dict);

}  // namespace grouplin
