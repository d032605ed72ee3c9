// Writing `.pt` files: plan the storage records (tensors viewing overlapping bytes of one storage
// share a record), emit the protocol-2 pickle torch.save would, check it with the reader's own
// pickle machine, then stream the records through the zip writer.
#include "io/formats/pt_writer.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "core/utf8.hpp"
#include "grouplin/error.hpp"
#include "grouplin/pt_file.hpp"
#include "io/formats/pickle_machine.hpp"
#include "io/formats/zip.hpp"

namespace grouplin {
namespace {

constexpr std::string_view kFolder = "archive/";
constexpr std::string_view kLittle = "little";  // the byteorder record
constexpr std::string_view kVersion = "3\n";    // the version record
constexpr size_t kSetItemsBatch = 1000;         // as Python's pickler
// Bytes per sink write of a storage record (CRC then write, piece by piece). Not tuned: it only
// bounds the size of one write; the CRC (about 2 GB/s) dominates either way.
constexpr size_t kChunk = size_t{8} << 20;

// How torch names a dtype: a typed storage (v2) or, for dtypes added later, a dtype tag (v3).
struct TorchType {
  const char* storage;  // "FloatStorage"; nullptr for v3 dtypes
  const char* dtype;    // "float8_e4m3fn" for v3 dtypes
};

// Requires: t is one of the DType enumerators (the error is for a value outside them).
TorchType torch_type(DType t, const std::string& context, const std::string& name) {
  switch (t) {
    case DType::F32:
      return {"FloatStorage", nullptr};
    case DType::F64:
      return {"DoubleStorage", nullptr};
    case DType::F16:
      return {"HalfStorage", nullptr};
    case DType::BF16:
      return {"BFloat16Storage", nullptr};
    case DType::I64:
      return {"LongStorage", nullptr};
    case DType::I32:
      return {"IntStorage", nullptr};
    case DType::I16:
      return {"ShortStorage", nullptr};
    case DType::I8:
      return {"CharStorage", nullptr};
    case DType::U8:
      return {"ByteStorage", nullptr};
    case DType::BOOL:
      return {"BoolStorage", nullptr};
    case DType::F8_E4M3:
      return {nullptr, "float8_e4m3fn"};
    case DType::F8_E5M2:
      return {nullptr, "float8_e5m2"};
    case DType::F8_E8M0:
      return {nullptr, "float8_e8m0fnu"};
    case DType::U16:
      return {nullptr, "uint16"};
    case DType::U32:
      return {nullptr, "uint32"};
    case DType::U64:
      return {nullptr, "uint64"};
  }
  throw Error(ErrorCode::UnsupportedDType, context + ": tensor " + quote(name) + ": dtype value " +
                                               std::to_string(static_cast<int>(t)) +
                                               " has no PyTorch type");
}

// A storage record: bytes [begin, end) of one Storage, viewed by one or more tensors.
struct Record {
  std::shared_ptr<Storage> storage;
  size_t begin = 0;
  size_t end = 0;
  DType dtype = DType::U8;
  std::string key;  // assigned in order of first use
};

struct Placement {
  size_t record = 0;
  int64_t storage_offset = 0;  // elements from the record's start
};

// The storage records of a dict, and where each tensor (in dict order) lies in them.
struct Plan {
  std::vector<Record> records;
  std::vector<Placement> placed;
};

// Groups the dict's tensors into records. Tensors of one dtype whose byte ranges overlap in
// one Storage share a record (torch's shared storages); everything else gets its own.
Plan plan_records(const StateDict& dict) {
  std::vector<Placement> placed;
  const size_t n = dict.size();
  std::vector<const Tensor*> tensors;
  for (const auto& [name, t] : dict) tensors.push_back(&t);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  // Empty tensors form groups of their own: they share nothing and must not end a cluster.
  auto group = [&](size_t i) {
    return std::make_tuple(reinterpret_cast<uintptr_t>(tensors[i]->storage().get()),
                           tensors[i]->dtype(), tensors[i]->nbytes() == 0);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (group(a) != group(b)) return group(a) < group(b);
    return tensors[a]->storage_offset() < tensors[b]->storage_offset();
  });

  std::vector<Record> records;
  placed.assign(n, {});
  for (size_t i = 0; i < n;) {
    // A cluster: consecutive tensors of the group whose ranges overlap the running range.
    const Tensor& t0 = *tensors[order[i]];
    size_t j = i + 1;
    size_t end = t0.storage_offset() + t0.nbytes();
    while (j < n && t0.nbytes() != 0 && group(order[j]) == group(order[i]) &&
           tensors[order[j]]->storage_offset() < end) {
      end = std::max(end, tensors[order[j]]->storage_offset() + tensors[order[j]]->nbytes());
      ++j;
    }
    const size_t esize = dtype_size(t0.dtype());
    bool shareable = true;
    for (size_t k = i; k < j; ++k)
      shareable =
          shareable && (tensors[order[k]]->storage_offset() - t0.storage_offset()) % esize == 0;
    for (size_t k = i; k < j; ++k) {
      const Tensor& t = *tensors[order[k]];
      if (k == i || !shareable) {
        size_t rend = shareable ? end : t.storage_offset() + t.nbytes();
        records.push_back({t.storage(), t.storage_offset(), rend, t.dtype(), {}});
      }
      placed[order[k]] = {
          records.size() - 1,
          static_cast<int64_t>((t.storage_offset() - records.back().begin) / esize)};
    }
    i = j;
  }
  // Keys in the order the dict first uses each record, as torch numbers its storages.
  std::vector<Record> ordered;
  std::vector<std::optional<size_t>> renumber(records.size());
  for (Placement& p : placed) {
    if (!renumber[p.record]) {
      renumber[p.record] = ordered.size();
      ordered.push_back(std::move(records[p.record]));
      ordered.back().key = std::to_string(ordered.size() - 1);
    }
    p.record = *renumber[p.record];
  }
  return {std::move(ordered), std::move(placed)};
}

// A protocol-2 pickle emitter with a memo for repeated globals and strings.
class Pickler {
 public:
  void raw(uint8_t op) { out_.push_back(static_cast<std::byte>(op)); }
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      raw('K');
      le(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      raw('M');
      le(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      raw('J');
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {  // LONG1: shortest two's complement
      int n = 1;
      while (n < 8 && !(v >= -(int64_t{1} << (8 * n - 1)) && v < (int64_t{1} << (8 * n - 1)))) ++n;
      raw(0x8a);
      le(static_cast<uint64_t>(n), 1);
      le(static_cast<uint64_t>(v), n);
    }
  }
  void string(std::string_view s) {
    raw('X');
    le(s.size(), 4);
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  // Emits a global or a string once, then fetches it from the memo.
  void memoized(const std::string& id, bool global) {
    auto it = memo_.find(id);
    if (it != memo_.end()) {
      get(it->second);
      return;
    }
    if (global) {
      raw('c');
      size_t dot = id.rfind('.');
      std::string line = id.substr(0, dot) + "\n" + id.substr(dot + 1) + "\n";
      const auto* p = reinterpret_cast<const std::byte*>(line.data());
      out_.insert(out_.end(), p, p + line.size());
    } else {
      string(id.substr(1));
    }
    auto index = static_cast<uint32_t>(memo_.size());
    memo_.emplace(id, index);
    if (index < 256) {
      raw('q');
      le(index, 1);
    } else {
      raw('r');
      le(index, 4);
    }
  }
  void global(const std::string& name) { memoized(name, true); }
  void memo_string(const std::string& s) { memoized("'" + s, false); }
  void tuple_of(const std::vector<int64_t>& v) {
    if (v.empty()) {
      raw(')');
      return;
    }
    if (v.size() > 3) raw('(');
    for (int64_t x : v) integer(x);
    raw(v.size() == 1 ? 0x85 : v.size() == 2 ? 0x86 : v.size() == 3 ? 0x87 : 't');
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  void get(uint32_t index) {
    if (index < 256) {
      raw('h');
      le(index, 1);
    } else {
      raw('j');
      le(index, 4);
    }
  }
  std::vector<std::byte> out_;
  std::unordered_map<std::string, uint32_t> memo_;
};

std::vector<std::byte> make_pickle(std::span<const detail::PtTensorSpec> tensors,
                                   std::span<const detail::PtRecordSpec> records,
                                   const std::string& context) {
  Pickler p;
  p.raw(0x80);
  p.raw(2);
  p.global("collections.OrderedDict");
  p.raw(')');
  p.raw('R');
  size_t i = 0;
  for (const detail::PtTensorSpec& t : tensors) {
    if (i % kSetItemsBatch == 0) p.raw('(');
    const detail::PtRecordSpec& r = records[t.record];
    const TorchType type = torch_type(t.dtype, context, t.name);
    const bool v3 = type.storage == nullptr;
    p.string(t.name);
    p.global(v3 ? "torch._utils._rebuild_tensor_v3" : "torch._utils._rebuild_tensor_v2");
    p.raw('(');
    p.raw('(');  // persistent id ('storage', type, key, 'cpu', numel)
    p.memo_string("storage");
    // As PyTorch 2.x names the class (its module is torch.storage): the only spelling
    // torch.load(weights_only=True) accepts.
    p.global(v3 ? std::string("torch.storage.UntypedStorage")
                : std::string("torch.") + type.storage);
    p.string(r.key);
    p.memo_string("cpu");
    const uint64_t record_bytes = r.nbytes;
    p.integer(static_cast<int64_t>(v3 ? record_bytes : record_bytes / dtype_size(t.dtype)));
    p.raw('t');
    p.raw('Q');
    p.integer(t.storage_offset);
    p.tuple_of(t.shape);
    std::vector<int64_t> stride(t.shape.size());
    int64_t s = 1;
    for (size_t d = t.shape.size(); d-- > 0;) {
      stride[d] = s;
      s *= t.shape[d];
    }
    p.tuple_of(stride);
    p.raw(0x89);  // requires_grad=False
    p.global("collections.OrderedDict");
    p.raw(')');
    p.raw('R');
    if (v3) p.global(std::string("torch.") + type.dtype);
    p.raw('t');
    p.raw('R');
    ++i;
    if (i % kSetItemsBatch == 0 || i == tensors.size()) p.raw('u');
  }
  // _metadata: {'version': 1} for the root and every module prefix, as module.state_dict().
  std::vector<std::string> prefixes{""};
  std::unordered_map<std::string, bool> seen{{"", true}};
  for (const detail::PtTensorSpec& t : tensors) {
    const std::string& name = t.name;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
      std::string prefix = name.substr(0, dot);
      if (seen.emplace(prefix, true).second) prefixes.push_back(prefix);
    }
  }
  p.raw('}');
  p.string("_metadata");
  p.global("collections.OrderedDict");
  p.raw(')');
  p.raw('R');
  for (size_t k = 0; k < prefixes.size(); ++k) {
    if (k % kSetItemsBatch == 0) p.raw('(');
    p.string(prefixes[k]);
    p.raw('}');
    p.memo_string("version");
    p.integer(1);
    p.raw('s');
    if ((k + 1) % kSetItemsBatch == 0 || k + 1 == prefixes.size()) p.raw('u');
  }
  p.raw('s');
  p.raw('b');
  p.raw('.');
  return std::move(p.bytes());
}

// What the reader's pickle machine would refuse in a tensor, checked before the pickle is built
// so that the error names the tensor (the machine's own error names an offset in the pickle).
void check_tensor_for_reader(const detail::PtTensorSpec& t, const std::string& context,
                             const pickle::PickleLimits& limits) {
  if (!utf8::is_valid(t.name, /*allow_surrogates=*/true)) {
    throw Error(ErrorCode::InvalidArgument,
                context + ": tensor name " + quote(t.name) + " is not valid UTF-8");
  }
  if (t.name.size() > limits.max_string) {
    throw Error(ErrorCode::PickleLimitExceeded,
                context + ": tensor " + quote(t.name) + ": a name of " +
                    std::to_string(t.name.size()) + " bytes, more than the " +
                    std::to_string(limits.max_string) + " the .pt reader accepts");
  }
  if (t.shape.size() > limits.max_rank) {
    throw Error(ErrorCode::PickleLimitExceeded,
                context + ": tensor " + quote(t.name) + ": " + std::to_string(t.shape.size()) +
                    " dimensions, more than the " + std::to_string(limits.max_rank) +
                    " the .pt reader accepts");
  }
}

// The reader's own check of what is about to be written.
void verify_pickle(std::span<const std::byte> pkl, std::span<const detail::PtTensorSpec> tensors,
                   std::span<const detail::PtRecordSpec> records, const std::string& context,
                   const pickle::PickleLimits& limits) {
  if (pkl.size() > limits.max_bytes) {
    throw Error(ErrorCode::PickleLimitExceeded,
                context + ": the pickle of " + std::to_string(tensors.size()) + " tensors has " +
                    std::to_string(pkl.size()) + " bytes, more than the " +
                    std::to_string(limits.max_bytes) + " the .pt reader accepts");
  }
  pickle::PickledStateDict back;
  try {
    back = pickle::run_pickle(pkl, limits);
  } catch (const Error& e) {
    throw Error(e.code(), context + ": the pickle does not read back: " + e.message());
  }
  if (back.tensors.size() != tensors.size() || back.storages.size() != records.size()) {
    throw Error(ErrorCode::InvalidPickle,
                context + ": the pickle reads back as " + std::to_string(back.tensors.size()) +
                    " tensors and " + std::to_string(back.storages.size()) + " storages, not " +
                    std::to_string(tensors.size()) + " and " + std::to_string(records.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const detail::PtTensorSpec& t = tensors[i];
    const auto& [name, bt] = back.tensors[i];
    if (name != t.name || bt.shape != t.shape || bt.dtype != t.dtype ||
        bt.storage >= records.size() ||
        back.storages[bt.storage].nbytes() != records[bt.storage].nbytes) {
      throw Error(ErrorCode::InvalidPickle, context + ": tensor " + quote(t.name) +
                                                " does not read back from the pickle as written");
    }
  }
}

}  // namespace

namespace detail {

PtArchive::PtArchive(std::span<const PtTensorSpec> tensors, std::span<const PtRecordSpec> records,
                     uint64_t start_position, std::string context,
                     const pickle::PickleLimits& limits)
    : start_position_(start_position), context_(std::move(context)) {
  for (const PtTensorSpec& t : tensors) check_tensor_for_reader(t, context_, limits);
  pickle_ = make_pickle(tensors, records, context_);
  verify_pickle(pickle_, tensors, records, context_, limits);

  // The records in file order: data.pkl, byteorder, the storages, version.
  const std::string folder(kFolder);
  names_.push_back(folder + "data.pkl");
  sizes_.push_back(pickle_.size());
  names_.push_back(folder + "byteorder");
  sizes_.push_back(kLittle.size());
  for (const PtRecordSpec& r : records) {
    names_.push_back(folder + "data/" + r.key);
    sizes_.push_back(r.nbytes);
  }
  names_.push_back(folder + "version");
  sizes_.push_back(kVersion.size());
  uint64_t at = start_position;
  for (size_t i = 0; i < names_.size(); ++i) {
    const zip::ZipWriter::RecordLayout layout =
        zip::ZipWriter::record_layout(at, names_[i], sizes_[i], zip::ZipWriter::Options{});
    data_offsets_.push_back(layout.data_offset);
    at = layout.end_offset;
  }
}

void PtArchive::write(
    FileSink& sink,
    const std::function<std::optional<uint32_t>(size_t, zip::ZipWriter&)>& write_record) const {
  if (sink.position() != start_position_) {
    throw Error(ErrorCode::InvalidArgument,
                context_ + ": the sink is at byte " + std::to_string(sink.position()) +
                    ", the archive was laid out for byte " + std::to_string(start_position_));
  }
  zip::ZipWriter::Options options;
  options.context = context_;
  zip::ZipWriter zip(sink, options);
  const size_t storages = names_.size() - 3;
  zip.add_record(names_[0], pickle_);
  zip.add_record(names_[1], std::as_bytes(std::span(kLittle.data(), kLittle.size())));
  for (size_t i = 0; i < storages; ++i) {
    zip.begin_record(names_[2 + i], sizes_[2 + i]);
    if (std::optional<uint32_t> crc = write_record(i, zip)) {
      zip.end_record(*crc);
    } else {
      zip.end_record();
    }
  }
  zip.add_record(names_.back(), std::as_bytes(std::span(kVersion.data(), kVersion.size())));
  zip.finish();
}

void write_pt_archive(
    FileSink& sink, std::span<const PtTensorSpec> tensors, std::span<const PtRecordSpec> records,
    const std::string& context,
    const std::function<std::optional<uint32_t>(size_t, zip::ZipWriter&)>& write_record) {
  PtArchive(tensors, records, sink.position(), context).write(sink, write_record);
}

}  // namespace detail

namespace {

// write_pt with `context` starting every error message: "writing .pt" for a sink, `saving
// "out.pt"` for a file.
void write_pt_file(FileSink& sink, const StateDict& dict, const std::string& context) {
  for (const auto& [name, t] : dict) {
    if (!t.defined()) {
      throw Error(ErrorCode::UndefinedTensor,
                  context + ": tensor " + quote(name) + " is undefined");
    }
  }
  const Plan plan = plan_records(dict);
  std::vector<detail::PtTensorSpec> tensors;
  tensors.reserve(dict.size());
  size_t i = 0;
  for (const auto& [name, t] : dict) {
    tensors.push_back(
        {name, t.dtype(), t.shape(), plan.placed[i].record, plan.placed[i].storage_offset});
    ++i;
  }
  std::vector<detail::PtRecordSpec> records;
  records.reserve(plan.records.size());
  for (const Record& r : plan.records) records.push_back({r.key, r.end - r.begin});

  detail::write_pt_archive(sink, tensors, records, context,
                           [&](size_t k, zip::ZipWriter& zip) -> std::optional<uint32_t> {
                             const Record& r = plan.records[k];
                             for (size_t at = r.begin; at < r.end;
                                  at += std::min(kChunk, r.end - at)) {
                               zip.write({r.storage->data() + at, std::min(kChunk, r.end - at)});
                             }
                             return std::nullopt;
                           });
}

}  // namespace

void write_pt(FileSink& sink, const StateDict& dict) { write_pt_file(sink, dict, "writing .pt"); }

void save_pt(const std::string& path, const StateDict& dict) {
  std::unique_ptr<AtomicFile> file = AtomicFile::create(path);
  write_pt_file(*file, dict, "saving " + quote(path));
  // A failure to flush the folder after the rename is not reported (folder_flush_error()): the
  // file is whole and in place, and the OS writes the folder entry back on its own.
  file->commit();
}

}  // namespace grouplin
