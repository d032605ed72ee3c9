// Value comparison of two checkpoints modulo layout and format (see grouplin/compare.hpp).
#include "grouplin/compare.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "grouplin/error.hpp"
#include "io/checkpoint_source.hpp"
#include "io/planned_reader.hpp"
#include "layout/plan.hpp"

namespace grouplin {
namespace {

// Bytes read per pread from each file; a multiple of every element size. Two 256 KiB buffers stay
// in the L2 cache between the read and the comparison (1 MiB reads were 3-5x slower here).
constexpr size_t kChunk = size_t{256} << 10;

// The element at `p` (any alignment) as text: the value, and its bits when the value does not
// show them all (NaN payloads, -0).
std::string element_text(const std::byte* p, DType t) {
  char buf[64];
  uint64_t bits = 0;
  const size_t size = dtype_size(t);
  std::memcpy(&bits, p, size);  // little-endian host, as the files
  switch (t) {
    case DType::F64: {
      double v;
      std::memcpy(&v, p, 8);
      std::snprintf(buf, sizeof buf, "%.17g", v);
      break;
    }
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::F8_E4M3:
    case DType::F8_E5M2:
    case DType::F8_E8M0: {
      float v = 0;
      convert_elements(p, t, &v, DType::F32, 1);
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
      break;
    }
    case DType::BOOL:
      std::snprintf(buf, sizeof buf, "%s", bits ? "true" : "false");
      return buf;
    case DType::U8:
    case DType::U16:
    case DType::U32:
    case DType::U64:
      std::snprintf(buf, sizeof buf, "%" PRIu64, bits);
      return buf;
    case DType::I8:
    case DType::I16:
    case DType::I32:
    case DType::I64: {
      const int shift = static_cast<int>(64 - 8 * size);
      const auto v = static_cast<int64_t>(bits << shift) >> shift;  // sign-extend
      std::snprintf(buf, sizeof buf, "%" PRId64, v);
      return buf;
    }
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, " (0x%0*" PRIx64 ")", static_cast<int>(2 * size), bits);
  return std::string(buf) + hex;
}

// "[2, 5]" for flat element `index` of `shape`.
std::string index_text(uint64_t index, const Shape& shape) {
  if (shape.empty()) return "[]";
  std::vector<uint64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const auto n = static_cast<uint64_t>(shape[d]);
    idx[d] = n == 0 ? 0 : index % n;
    index = n == 0 ? 0 : index / n;
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

// The per-expert form of a checkpoint, by name.
struct Canonical {
  std::unique_ptr<detail::CheckpointSource> src;
  ConversionPlan plan;
  std::unordered_map<std::string, size_t> index;
};

Canonical open_canonical(const std::string& path, const CompareOptions& options) {
  PtReadOptions pt;
  pt.check_storage_crc = true;
  Canonical c;
  c.src = detail::CheckpointSource::open(path, pt);
  try {
    c.plan = layout::plan(
        c.src->tensors(), layout::Target::Compare,
        {options.rules, options.model_type.empty() ? c.src->model_type() : options.model_type,
         std::nullopt});
  } catch (const Error& e) {
    throw Error(e.code(), "reading " + quote(path) + ": " + e.message());
  }
  for (size_t i = 0; i < c.plan.tensors.size(); ++i) c.index.emplace(c.plan.tensors[i].name, i);
  return c;
}

// Compares the bytes of two tensors of the same dtype and shape; returns "" when equal, else the
// description of the difference.
std::string compare_values(const Canonical& a, const PlannedTensor& ta, const Canonical& b,
                           const PlannedTensor& tb, std::vector<std::byte>& buf_a,
                           std::vector<std::byte>& buf_b) {
  detail::PlannedReader ra(*a.src, ta), rb(*b.src, tb);
  const uint64_t n = ta.nbytes();
  const size_t esize = dtype_size(ta.dtype);
  uint64_t differing = 0;
  uint64_t first = 0;
  std::string first_values;
  for (uint64_t at = 0; at < n; at += kChunk) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunk, n - at));
    ra.read(std::span(buf_a.data(), len));
    rb.read(std::span(buf_b.data(), len));
    if (std::memcmp(buf_a.data(), buf_b.data(), len) == 0) continue;
    for (size_t e = 0; e < len; e += esize) {
      if (std::memcmp(buf_a.data() + e, buf_b.data() + e, esize) == 0) continue;
      if (differing++ == 0) {
        first = (at + e) / esize;
        first_values = element_text(buf_a.data() + e, ta.dtype) + " vs " +
                       element_text(buf_b.data() + e, tb.dtype);
      }
    }
  }
  if (differing == 0) return "";
  return std::to_string(differing) + " of " + std::to_string(n / esize) +
         " elements differ, first at " + index_text(first, ta.shape) + ": " + first_values;
}

}  // namespace

CompareReport compare_checkpoints(const std::string& a_path, const std::string& b_path,
                                  const CompareOptions& options) {
  const Canonical a = open_canonical(a_path, options);
  const Canonical b = open_canonical(b_path, options);
  CompareReport r;
  r.format_a = a.src->format();
  r.format_b = b.src->format();
  r.modules_a = a.plan.modules;
  r.modules_b = b.plan.modules;
  r.shards_a = a.src->directory() ? a.src->files().size() : 0;
  r.shards_b = b.src->directory() ? b.src->files().size() : 0;
  r.warnings = a.src->warnings();
  r.warnings.insert(r.warnings.end(), b.src->warnings().begin(), b.src->warnings().end());
  auto differ = [&](const std::string& name, const std::string& what) {
    r.same = false;
    if (r.differing++ < options.max_listed) r.differences.push_back(quote(name) + ": " + what);
  };

  std::vector<std::byte> buf_a(kChunk), buf_b(kChunk);
  for (const PlannedTensor& ta : a.plan.tensors) {
    auto it = b.index.find(ta.name);
    if (it == b.index.end()) {
      differ(ta.name, "only in A");
      continue;
    }
    const PlannedTensor& tb = b.plan.tensors[it->second];
    ++r.tensors_compared;
    if (ta.dtype != tb.dtype) {
      differ(ta.name, "dtype " + std::string(dtype_name(ta.dtype)) + " vs " +
                          std::string(dtype_name(tb.dtype)));
      continue;
    }
    if (ta.shape != tb.shape) {
      differ(ta.name, "shape " + shape_to_string(ta.shape) + " vs " + shape_to_string(tb.shape));
      continue;
    }
    std::string what = compare_values(a, ta, b, tb, buf_a, buf_b);
    r.bytes_compared += ta.nbytes();
    if (!what.empty()) differ(ta.name, what);
  }
  for (const PlannedTensor& tb : b.plan.tensors) {
    if (a.index.count(tb.name) == 0) differ(tb.name, "only in B");
  }
  return r;
}

}  // namespace grouplin
