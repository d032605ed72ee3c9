// Value comparison of two checkpoints modulo layout and format (see grouplin/compare.hpp).
#include "grouplin/compare.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "grouplin/error.hpp"
#include "io/checkpoints/checkpoint_source.hpp"
#include "layout/plan.hpp"
#include "layout/planned_reader.hpp"

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
  std::string model_type;  // what picks its rules when none are given
  ConversionPlan plan;
  std::unordered_map<std::string, size_t> index;
};

Canonical open_source(const std::string& path, const CompareOptions& options) {
  PtReadOptions pt;
  pt.check_storage_crc = true;
  pt.state_dict_key = options.state_dict_key;
  Canonical c;
  c.src = detail::CheckpointSource::open(path, pt);
  c.model_type = options.model_type.empty() ? c.src->model_type() : options.model_type;
  return c;
}

// One model family for both sides where only one names it (a config.json beside one input):
// the two forms of one model are read by the same rules, or the warning says why not.
void agree_on_family(Canonical& a, Canonical& b, const std::string& a_path,
                     const std::string& b_path, const CompareOptions& options,
                     std::vector<Problem>& warnings) {
  if (!options.rules.empty() || !options.model_type.empty()) return;
  const bool known_a = rules_for_model_type(a.model_type).has_value();
  const bool known_b = rules_for_model_type(b.model_type).has_value();
  if (known_a == known_b) {
    if (known_a && a.model_type != b.model_type) {
      warnings.push_back({ErrorCode::ModelTypeAssumed, "",
                          quote(a_path) + " is model type " + quote(a.model_type) + " and " +
                              quote(b_path) + " " + quote(b.model_type) +
                              " (config.json): each is read by its own family's rules"});
    }
    return;
  }
  Canonical& from = known_a ? a : b;
  Canonical& to = known_a ? b : a;
  warnings.push_back({ErrorCode::ModelTypeAssumed, "",
                      quote(known_a ? b_path : a_path) +
                          " names no model family GroupLin knows (no config.json, or another "
                          "model_type): read by the rules of model type " +
                          quote(from.model_type) + ", as " + quote(known_a ? a_path : b_path) +
                          " is"});
  to.model_type = from.model_type;
}

void plan_canonical(Canonical& c, const std::string& path, const CompareOptions& options) {
  try {
    c.plan = layout::plan(c.src->tensors(), layout::Target::Compare,
                          {options.rules, c.model_type, std::nullopt, c.src->declared_modules()});
  } catch (const Error& e) {
    throw Error(e.code(), "reading " + quote(path) + ": " + e.message());
  }
  for (size_t i = 0; i < c.plan.tensors.size(); ++i) c.index.emplace(c.plan.tensors[i].name, i);
}

// Planned tensors of one checkpoint read one after the other: their concatenation along the
// first dim (one tensor, or the parts of a join); or, `transposed`, one rank-2 tensor read as its
// transpose (a transposed join's part: a router or shared expert, read whole into memory).
class JoinedReader {
 public:
  JoinedReader(const detail::CheckpointSource& src, const std::vector<const PlannedTensor*>& parts,
               bool transposed = false)
      : src_(src), parts_(parts), transposed_(transposed) {}

  void read(std::span<std::byte> dst) {
    if (transposed_) {
      if (turned_.empty()) turn();
      std::memcpy(dst.data(), turned_.data() + turned_at_, dst.size());
      turned_at_ += dst.size();
      return;
    }
    while (!dst.empty()) {
      if (!reader_ || reader_->left() == 0) {
        reader_ = std::make_unique<layout::PlannedReader>(src_, *parts_.at(next_++));
        continue;
      }
      const size_t len = static_cast<size_t>(std::min<uint64_t>(dst.size(), reader_->left()));
      reader_->read(dst.first(len));
      dst = dst.subspan(len);
    }
  }

 private:
  // The one part [rows, cols] read whole, then laid out as [cols, rows].
  void turn() {
    const PlannedTensor& t = *parts_.at(0);
    const size_t esize = dtype_size(t.dtype);
    const auto rows = static_cast<size_t>(t.shape.at(0)), cols = static_cast<size_t>(t.shape.at(1));
    std::vector<std::byte> stored(t.nbytes());
    layout::PlannedReader(src_, t).read(stored);
    turned_.resize(stored.size());
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < cols; ++c) {
        std::memcpy(turned_.data() + (c * rows + r) * esize, stored.data() + (r * cols + c) * esize,
                    esize);
      }
    }
  }

  const detail::CheckpointSource& src_;
  const std::vector<const PlannedTensor*>& parts_;
  const bool transposed_;
  size_t next_ = 0;
  std::unique_ptr<layout::PlannedReader> reader_;
  std::vector<std::byte> turned_;
  size_t turned_at_ = 0;
};

// Compares the bytes A's and B's readers give, of one dtype and `shape` all told; returns "" when
// equal, else the description of the difference.
// `read(bytes)` is told of each piece read, for progress.
std::string compare_values(JoinedReader& ra, JoinedReader& rb, DType dtype, const Shape& shape,
                           std::vector<std::byte>& buf_a, std::vector<std::byte>& buf_b,
                           const std::function<void(uint64_t)>& read) {
  const size_t esize = dtype_size(dtype);
  const uint64_t n = shape_numel(shape) * esize;
  uint64_t differing = 0;
  uint64_t first = 0;
  std::string first_values;
  for (uint64_t at = 0; at < n; at += kChunk) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunk, n - at));
    ra.read(std::span(buf_a.data(), len));
    rb.read(std::span(buf_b.data(), len));
    read(len);
    if (std::memcmp(buf_a.data(), buf_b.data(), len) == 0) continue;
    for (size_t e = 0; e < len; e += esize) {
      if (std::memcmp(buf_a.data() + e, buf_b.data() + e, esize) == 0) continue;
      if (differing++ == 0) {
        first = (at + e) / esize;
        first_values =
            element_text(buf_a.data() + e, dtype) + " vs " + element_text(buf_b.data() + e, dtype);
      }
    }
  }
  if (differing == 0) return "";
  return std::to_string(differing) + " of " + std::to_string(n / esize) +
         " elements differ, first at " + index_text(first, shape) + ": " + first_values;
}

// A tensor of one checkpoint that the other stores as the parts of a join (or the reverse).
struct Join {
  bool whole_in_a = true;
  const PlannedTensor* whole = nullptr;
  std::vector<const PlannedTensor*> parts;
  bool transposed = false;  // one part, the whole's transpose
};

// The joins verify follows: those of the given rule sets, else of each file's model family.
std::vector<JoinedTensors> joins_of(const CompareOptions& options, const Canonical& a,
                                    const Canonical& b) {
  std::vector<JoinedTensors> out;
  auto add = [&](const LayoutRules& r) { out.insert(out.end(), r.joins.begin(), r.joins.end()); };
  for (const LayoutRules& r : options.rules) add(r);
  if (!options.rules.empty()) return out;
  for (const Canonical* c : {&a, &b}) {
    const std::optional<std::string> family = rules_for_model_type(c->model_type);
    if (family && (c == &a || c->model_type != a.model_type)) add(builtin_rules(*family));
  }
  return out;
}

// The tensors of `other` that `whole`, a tensor of `own` that `other` lacks, is made of under one
// of `joins` (that join in `*found`): each part's name is the whole's with the join's whole text
// replaced by the part's, present in `other` only and not yet taken. Empty when there are none.
std::vector<const PlannedTensor*> parts_of(const PlannedTensor& whole,
                                           const std::vector<JoinedTensors>& joins,
                                           const Canonical& own, const Canonical& other,
                                           const std::unordered_set<std::string>& taken,
                                           const JoinedTensors** found) {
  const std::string& key = whole.name;
  for (const JoinedTensors& j : joins) {
    for (size_t at = key.find(j.whole); at != std::string::npos; at = key.find(j.whole, at + 1)) {
      std::vector<const PlannedTensor*> parts;
      for (const std::string& p : j.parts) {
        const std::string name = key.substr(0, at) + p + key.substr(at + j.whole.size());
        auto it = other.index.find(name);
        if (it == other.index.end() || own.index.count(name) != 0 || taken.count(name) != 0) break;
        parts.push_back(&other.plan.tensors[it->second]);
      }
      if (parts.size() == j.parts.size()) {
        *found = &j;
        return parts;
      }
    }
  }
  return {};
}

// The joins between A and B, A's wholes in A's order then B's; the names they take, per side.
std::vector<Join> find_joins(const Canonical& a, const Canonical& b,
                             const std::vector<JoinedTensors>& joins,
                             std::unordered_set<std::string>& taken_a,
                             std::unordered_set<std::string>& taken_b) {
  std::vector<Join> out;
  if (joins.empty()) return out;
  for (const bool whole_in_a : {true, false}) {
    const Canonical& own = whole_in_a ? a : b;
    const Canonical& other = whole_in_a ? b : a;
    std::unordered_set<std::string>& taken_own = whole_in_a ? taken_a : taken_b;
    std::unordered_set<std::string>& taken_other = whole_in_a ? taken_b : taken_a;
    for (const PlannedTensor& t : own.plan.tensors) {
      if (other.index.count(t.name) != 0 || taken_own.count(t.name) != 0) continue;
      const JoinedTensors* join = nullptr;
      std::vector<const PlannedTensor*> parts = parts_of(t, joins, own, other, taken_other, &join);
      if (parts.empty()) continue;
      taken_own.insert(t.name);
      for (const PlannedTensor* p : parts) taken_other.insert(p->name);
      out.push_back({whole_in_a, &t, std::move(parts), join->transposed});
    }
  }
  return out;
}

// "" when a join's parts make its whole along the first dim (a transposed join's part, turned),
// in its dtype; otherwise the difference ("shape [96, 32] F32 vs [32, 32] + [32, 32] + [16, 32]
// F32 + F32 + F32"; "shape [4, 32] F32 vs [4, 32] F32 transposed").
std::string join_mismatch(const Join& j) {
  if (j.transposed) {
    const PlannedTensor& p = *j.parts.at(0);
    const Shape& w = j.whole->shape;
    if (w.size() == 2 && p.dtype == j.whole->dtype && p.shape == Shape{w[1], w[0]}) return "";
    return "shape " + shape_to_string(w) + " " + std::string(dtype_name(j.whole->dtype)) + " vs " +
           shape_to_string(p.shape) + " " + std::string(dtype_name(p.dtype)) + " transposed";
  }
  Shape joined = j.whole->shape;
  int64_t rows = 0;
  bool fits = !joined.empty();
  std::string shapes, dtypes;
  for (const PlannedTensor* p : j.parts) {
    shapes += (shapes.empty() ? "" : " + ") + shape_to_string(p->shape);
    dtypes += (dtypes.empty() ? "" : " + ") + std::string(dtype_name(p->dtype));
    fits = fits && p->dtype == j.whole->dtype && p->shape.size() == joined.size() &&
           std::equal(p->shape.begin() + 1, p->shape.end(), joined.begin() + 1);
    if (fits) rows += p->shape[0];
  }
  if (fits && rows == joined[0]) return "";
  return "shape " + shape_to_string(joined) + " " + std::string(dtype_name(j.whole->dtype)) +
         " vs " + shapes + " " + dtypes;
}

}  // namespace

CompareReport compare_checkpoints(const std::string& a_path, const std::string& b_path,
                                  const CompareOptions& options) {
  Canonical a = open_source(a_path, options);
  Canonical b = open_source(b_path, options);
  std::vector<Problem> family_warnings;
  agree_on_family(a, b, a_path, b_path, options, family_warnings);
  plan_canonical(a, a_path, options);
  plan_canonical(b, b_path, options);
  CompareReport r;
  r.format_a = a.src->format();
  r.format_b = b.src->format();
  r.modules_a = a.plan.modules;
  r.modules_b = b.plan.modules;
  r.shards_a = a.src->directory() ? a.src->files().size() : 0;
  r.shards_b = b.src->directory() ? b.src->files().size() : 0;
  r.warnings = a.src->warnings();
  r.warnings.insert(r.warnings.end(), b.src->warnings().begin(), b.src->warnings().end());
  r.warnings.insert(r.warnings.end(), family_warnings.begin(), family_warnings.end());
  // `label` names the entry: quoted, as every message quotes names.
  auto differ = [&](const std::string& label, const std::string& what) {
    r.same = false;
    if (r.differing++ < options.max_listed) r.differences.push_back(label + ": " + what);
  };

  std::unordered_set<std::string> joined_a, joined_b;
  const std::vector<Join> joins = find_joins(a, b, joins_of(options, a, b), joined_a, joined_b);

  // Progress: bytes of values compared, of all of A's (at most every 16 MiB, and at the end).
  uint64_t total = 0, done = 0, told = 0;
  for (const PlannedTensor& ta : a.plan.tensors) total += ta.nbytes();
  const std::function<void(uint64_t)> read = [&](uint64_t bytes) {
    done = std::min(total, done + bytes);
    if (options.progress && done - told >= (uint64_t{16} << 20)) {
      told = done;
      options.progress(done, total);
    }
  };
  if (options.progress) options.progress(0, total);
  std::vector<std::byte> buf_a(kChunk), buf_b(kChunk);
  for (const PlannedTensor& ta : a.plan.tensors) {
    if (joined_a.count(ta.name) != 0) continue;
    auto it = b.index.find(ta.name);
    if (it == b.index.end()) {
      differ(quote(ta.name), "only in A");
      continue;
    }
    const PlannedTensor& tb = b.plan.tensors[it->second];
    ++r.tensors_compared;
    if (ta.dtype != tb.dtype) {
      differ(quote(ta.name), "dtype " + std::string(dtype_name(ta.dtype)) + " vs " +
                                 std::string(dtype_name(tb.dtype)));
      continue;
    }
    if (ta.shape != tb.shape) {
      differ(quote(ta.name),
             "shape " + shape_to_string(ta.shape) + " vs " + shape_to_string(tb.shape));
      continue;
    }
    const std::vector<const PlannedTensor*> pa = {&ta}, pb = {&tb};
    JoinedReader ra(*a.src, pa), rb(*b.src, pb);
    std::string what = compare_values(ra, rb, ta.dtype, ta.shape, buf_a, buf_b, read);
    r.bytes_compared += ta.nbytes();
    if (!what.empty()) differ(quote(ta.name), what);
  }
  for (const Join& j : joins) {
    std::string parts;
    for (const PlannedTensor* p : j.parts) parts += (parts.empty() ? "" : ", ") + quote(p->name);
    const std::string label = quote(j.whole->name) + " (" + (j.whole_in_a ? "A" : "B") + "; " +
                              (j.transposed ? "transposed" : "joined") + " from " + parts + " of " +
                              (j.whole_in_a ? "B" : "A") + ")";
    ++r.tensors_compared;
    std::string what = join_mismatch(j);
    if (what.empty()) {
      const std::vector<const PlannedTensor*> whole = {j.whole};
      JoinedReader rw(*(j.whole_in_a ? a : b).src, whole);
      JoinedReader rp(*(j.whole_in_a ? b : a).src, j.parts, j.transposed);
      what = j.whole_in_a
                 ? compare_values(rw, rp, j.whole->dtype, j.whole->shape, buf_a, buf_b, read)
                 : compare_values(rp, rw, j.whole->dtype, j.whole->shape, buf_a, buf_b, read);
      r.bytes_compared += j.whole->nbytes();
    }
    if (!what.empty()) differ(label, what);
  }
  if (options.progress) options.progress(total, total);
  for (const PlannedTensor& tb : b.plan.tensors) {
    if (a.index.count(tb.name) == 0 && joined_b.count(tb.name) == 0)
      differ(quote(tb.name), "only in B");
  }
  return r;
}

}  // namespace grouplin
