// The one validator for safetensors headers: the JSON, its structure, the tiling of the data
// buffer. The order of the checks and the code of each is the contract in
// include/grouplin/safetensors.hpp; safetensors_reader.cpp maps files and builds tensors on it.
#include "io/formats/safetensors_header.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "core/parser_text.hpp"
#include "core/utf8.hpp"
#include "grouplin/error.hpp"
#include "grouplin/safetensors.hpp"

namespace grouplin {

namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Every product of sizes read from a file goes through here: nullopt on overflow. (The only sums,
// 8 + N and end - begin, are bounded by the checks before them.)
std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Dtype strings the safetensors format defines but GroupLin has no element type for.
bool is_foreign_dtype(std::string_view name) {
  static constexpr std::string_view kForeign[] = {"F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "C64"};
  return std::find(std::begin(kForeign), std::end(kForeign), name) != std::end(kForeign);
}

std::string offsets_to_string(uint64_t begin, uint64_t end) {
  // Appended piece by piece: "[" + to_string(...) trips GCC 12's false -Wrestrict (bug 105329).
  std::string s = "[";
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  s += ']';
  return s;
}

// One header entry while it is being read.
struct RawEntry {
  std::string name;
  std::optional<DType> dtype;
  std::vector<uint64_t> dims;
  std::vector<uint64_t> offsets;
  bool has_shape = false;
  bool has_offsets = false;
};

// nlohmann's SAX interface: its parser is iterative (an explicit stack of bits, no recursion),
// so no nesting depth can overflow our stack, and it reports every key, so duplicates are seen
// (its DOM parser silently keeps the last of two equal keys). The handler keeps only what the
// format allows and records the FIRST structural problem; parsing goes on to the end, so that a
// JSON syntax error anywhere wins over any structural problem (the order is parse → structure).
class HeaderHandler {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  explicit HeaderHandler(const std::string& context) : context_(context) {}

  // What is being read: where the next value goes.
  enum class Where { Top, Entries, Metadata, Entry, Shape, Offsets, Done };
  enum class Field { None, DType, Shape, Offsets };

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(number_integer_t v) {
    // nlohmann reports a number with a minus sign here ("-0" included), as serde's usize rejects.
    if (failed()) return true;
    return number(std::nullopt, "the negative number " + std::to_string(v));
  }
  bool number_unsigned(number_unsigned_t v) { return number(v, ""); }
  bool number_float(number_float_t, const string_t& text) {
    if (failed()) return true;
    std::string shown = text.size() <= 40 ? text : text.substr(0, 40) + "...";
    return number(std::nullopt, "the number " + shown + " (not an integer, or too large)");
  }
  bool binary(binary_t&) { return scalar("binary data"); }

  bool string(string_t& value) {
    if (failed()) return true;
    switch (where()) {
      case Where::Metadata:
        metadata_[pending_key_] = std::move(value);
        return true;
      case Where::Entry:
        if (field_ == Field::DType) {
          set_dtype(value);
          return true;
        }
        return scalar("a string");
      default:
        return scalar("a string");
    }
  }

  bool start_object(std::size_t) {
    if (failed()) return true;
    switch (where()) {
      case Where::Top:
        stack_.back() = Where::Done;
        stack_.push_back(Where::Entries);
        return true;
      case Where::Entries:
        if (pending_key_ == "__metadata__") {
          stack_.push_back(Where::Metadata);
        } else {
          entries_.push_back(RawEntry{});
          entries_.back().name = pending_key_;
          seen_fields_ = 0;
          stack_.push_back(Where::Entry);
        }
        return true;
      default:
        return scalar("an object");
    }
  }

  bool key(string_t& k) {
    if (failed()) return true;
    switch (where()) {
      case Where::Entries:
        if (!names_.insert(k).second) {
          fail(ErrorCode::DuplicateName, "the header has two entries named " + quote(k));
        }
        break;
      case Where::Metadata:
        if (metadata_.count(k) != 0) {
          fail(ErrorCode::DuplicateName, "\"__metadata__\" has two entries named " + quote(k));
        }
        break;
      case Where::Entry:
        entry_key(k);
        break;
      default:
        break;
    }
    pending_key_ = std::move(k);
    return true;
  }

  bool end_object() {
    if (failed()) return true;
    if (where() == Where::Entry) check_entry(entries_.back());
    stack_.pop_back();
    return true;
  }

  bool start_array(std::size_t) {
    if (failed()) return true;
    if (where() == Where::Entry && field_ == Field::Shape) {
      stack_.push_back(Where::Shape);
      return true;
    }
    if (where() == Where::Entry && field_ == Field::Offsets) {
      stack_.push_back(Where::Offsets);
      return true;
    }
    return scalar("an array");
  }

  bool end_array() {
    if (failed()) return true;
    if (where() == Where::Offsets && entries_.back().offsets.size() != 2) {
      fail(ErrorCode::InvalidOffsets, entry_prefix() + "data_offsets has " +
                                          std::to_string(entries_.back().offsets.size()) +
                                          " numbers, expected 2: [begin, end]");
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    // ex.what() quotes the last token: escaped and cut short, as every parser's text is.
    syntax_error_ = "the header is not valid JSON (at byte " + std::to_string(position) +
                    " of the header): " + detail::parser_text(ex.what());
    return false;
  }

  // Throws the syntax error if there was one, else the first structural problem, if any.
  void throw_if_failed() const {
    if (syntax_error_) throw Error(ErrorCode::InvalidHeader, context_ + ": " + *syntax_error_);
    if (error_) throw Error(error_code_, context_ + ": " + *error_);
  }

  std::vector<RawEntry>& entries() { return entries_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }

 private:
  Where where() const { return stack_.back(); }
  bool failed() const { return error_.has_value(); }

  void fail(ErrorCode code, std::string message) {
    if (failed()) return;
    error_code_ = code;
    error_ = std::move(message);
  }

  std::string entry_prefix() const { return "tensor " + quote(entries_.back().name) + ": "; }

  // A value the current place does not accept.
  bool scalar(const std::string& what) {
    if (failed()) return true;
    switch (where()) {
      case Where::Top:
        fail(ErrorCode::InvalidHeader, "the header is " + what + ", not a JSON object");
        break;
      case Where::Entries:
        if (pending_key_ == "__metadata__") {
          if (what != "null") {  // the reference accepts null as "no metadata"
            fail(ErrorCode::InvalidMetadata,
                 "\"__metadata__\" is " + what + ", not an object of strings");
          }
        } else {
          fail(ErrorCode::InvalidHeader,
               "tensor " + quote(pending_key_) + ": the entry is " + what + ", not an object");
        }
        break;
      case Where::Metadata:
        fail(ErrorCode::InvalidMetadata,
             "\"__metadata__\" entry " + quote(pending_key_) + " is " + what + ", not a string");
        break;
      case Where::Entry:
        if (field_ == Field::Offsets) {
          fail(ErrorCode::InvalidOffsets,
               entry_prefix() + "data_offsets is " + what + ", not an array [begin, end]");
        } else {
          fail(ErrorCode::InvalidHeader,
               entry_prefix() + std::string(field_name(field_)) + " is " + what + ", not " +
                   (field_ == Field::DType ? "a string" : "an array of integers"));
        }
        break;
      case Where::Shape:
        fail(ErrorCode::InvalidHeader,
             entry_prefix() + "shape holds " + what + ", not an integer >= 0");
        break;
      case Where::Offsets:
        fail(ErrorCode::InvalidOffsets,
             entry_prefix() + "data_offsets holds " + what + ", not an integer >= 0");
        break;
      case Where::Done:
        break;  // cannot happen: JSON allows one top-level value
    }
    return true;
  }

  // A number; `value` is set when it is an integer >= 0 that fits in 64 bits.
  bool number(std::optional<uint64_t> value, const std::string& what) {
    if (failed()) return true;
    if (!value) return scalar(what);
    if (where() == Where::Shape) {
      entries_.back().dims.push_back(*value);
    } else if (where() == Where::Offsets) {
      auto& offsets = entries_.back().offsets;
      if (offsets.size() == 2) {
        fail(ErrorCode::InvalidOffsets,
             entry_prefix() + "data_offsets has more than 2 numbers, expected [begin, end]");
      } else {
        offsets.push_back(*value);
      }
    } else {
      return scalar("the number " + std::to_string(*value));
    }
    return true;
  }

  static std::string_view field_name(Field f) {
    switch (f) {
      case Field::DType:
        return "dtype";
      case Field::Shape:
        return "shape";
      case Field::Offsets:
        return "data_offsets";
      case Field::None:
        break;
    }
    return "?";
  }

  void entry_key(const std::string& k) {
    Field f = k == "dtype"          ? Field::DType
              : k == "shape"        ? Field::Shape
              : k == "data_offsets" ? Field::Offsets
                                    : Field::None;
    if (f == Field::None) {
      fail(ErrorCode::InvalidHeader,
           entry_prefix() + "unknown field " + quote(k) + " (allowed: dtype, shape, data_offsets)");
      return;
    }
    unsigned bit = 1u << static_cast<unsigned>(f);
    if (seen_fields_ & bit) {
      fail(ErrorCode::DuplicateName,
           entry_prefix() + "field \"" + std::string(field_name(f)) + "\" appears twice");
      return;
    }
    seen_fields_ |= bit;
    field_ = f;
    if (f == Field::Shape) entries_.back().has_shape = true;
    if (f == Field::Offsets) entries_.back().has_offsets = true;
  }

  void set_dtype(const std::string& name) {
    if (auto t = dtype_from_name(name)) {
      entries_.back().dtype = *t;
    } else if (is_foreign_dtype(name)) {
      fail(ErrorCode::UnsupportedDType, entry_prefix() + "dtype " + quote(name) +
                                            " is valid safetensors but GroupLin has no such "
                                            "element type");
    } else {
      fail(ErrorCode::UnknownDType, entry_prefix() + "unknown dtype " + quote(name));
    }
  }

  // The checks on one complete entry, in order: fields present → offsets → size.
  void check_entry(const RawEntry& e) {
    const char* missing = !e.dtype         ? "dtype"
                          : !e.has_shape   ? "shape"
                          : !e.has_offsets ? "data_offsets"
                                           : nullptr;
    if (missing != nullptr) {
      fail(ErrorCode::InvalidHeader, entry_prefix() + "missing field " + quote(missing));
      return;
    }
    uint64_t begin = e.offsets[0], end = e.offsets[1];
    if (begin > end) {
      fail(ErrorCode::InvalidOffsets,
           entry_prefix() + "offsets " + offsets_to_string(begin, end) + " have begin > end");
      return;
    }
    auto described = [&] {
      return std::string(dtype_name(*e.dtype)) + " " + dims_to_string(e.dims);
    };
    std::optional<uint64_t> numel = 1;
    for (uint64_t d : e.dims) {
      if (d > kMaxInt64) {
        fail(ErrorCode::SizeOverflow,
             entry_prefix() + described() + " has a dimension larger than 2^63-1");
        return;
      }
      if (numel) numel = checked_mul(*numel, d);
    }
    std::optional<uint64_t> nbytes = numel ? checked_mul(*numel, dtype_size(*e.dtype)) : numel;
    if (!nbytes || *nbytes > kMaxInt64) {
      fail(ErrorCode::SizeOverflow, entry_prefix() + described() + " needs more than 2^63-1 bytes");
      return;
    }
    if (*nbytes != end - begin) {
      fail(ErrorCode::TensorSizeMismatch,
           entry_prefix() + "offsets " + offsets_to_string(begin, end) + " but " + described() +
               " needs " + std::to_string(*nbytes) + " bytes");
    }
  }

  // "[2, 3]"; a shape of more than 16 dimensions (legal, if odd) is cut short.
  static std::string dims_to_string(const std::vector<uint64_t>& dims) {
    std::string s = "[";
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i) s += ", ";
      if (i == 16) {
        s += "... (" + std::to_string(dims.size()) + " dimensions)";
        break;
      }
      s += std::to_string(dims[i]);
    }
    return s + "]";
  }

  const std::string& context_;
  std::vector<Where> stack_{Where::Top};
  std::string pending_key_;
  Field field_ = Field::None;
  unsigned seen_fields_ = 0;
  std::vector<RawEntry> entries_;
  std::unordered_set<std::string> names_;
  std::map<std::string, std::string> metadata_;
  std::optional<std::string> syntax_error_;
  std::optional<std::string> error_;
  ErrorCode error_code_ = ErrorCode::InvalidHeader;
};

}  // namespace

void check_safetensors_header_length(uint64_t n, const std::string& context) {
  if (n > kSafetensorsMaxHeaderSize) {
    throw Error(ErrorCode::HeaderTooLarge,
                context + ": the header length " + std::to_string(n) + " exceeds the limit of " +
                    std::to_string(kSafetensorsMaxHeaderSize) + " bytes");
  }
}

SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size,
                                           const std::string& context) {
  check_safetensors_header_length(json.size(), context);

  // parse: UTF-8 first (nlohmann checks strings only), then JSON with the structure alongside.
  if (size_t bad = utf8::error_offset(json); bad != json.size()) {
    throw Error(ErrorCode::InvalidHeader, context + ": the header is not valid UTF-8 (byte " +
                                              std::to_string(bad) + " of the header)");
  }
  // nlohmann's lexer ends the input at a NUL byte and skips a leading byte-order mark; JSON (and
  // the reference) allows neither, so both are refused here.
  if (size_t nul = json.find('\0'); nul != std::string_view::npos) {
    throw Error(ErrorCode::InvalidHeader,
                context + ": the header is not valid JSON (a NUL byte at byte " +
                    std::to_string(nul) + " of the header)");
  }
  if (json.starts_with("\xEF\xBB\xBF")) {
    throw Error(ErrorCode::InvalidHeader,
                context + ": the header is not valid JSON (it starts with a byte-order mark)");
  }
  HeaderHandler handler(context);
  Json::sax_parse(json.begin(), json.end(), &handler, nlohmann::detail::input_format_t::json,
                  /*strict=*/true, /*ignore_comments=*/false);
  handler.throw_if_failed();

  // tiling: sorted by offsets, each tensor begins where the previous one ended.
  std::vector<RawEntry>& raw = handler.entries();
  std::vector<size_t> order(raw.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(raw[a].offsets[0], raw[a].offsets[1]) <
           std::tie(raw[b].offsets[0], raw[b].offsets[1]);
  });
  uint64_t expected = 0;
  const RawEntry* prev = nullptr;
  for (size_t i : order) {
    const RawEntry& e = raw[i];
    uint64_t begin = e.offsets[0], end = e.offsets[1];
    if (begin != expected) {
      std::string at =
          context + ": tensor " + quote(e.name) + ": offsets " + offsets_to_string(begin, end);
      std::string message;
      if (prev == nullptr) {
        message = at + " leave bytes [0, " + std::to_string(begin) +
                  ") of the data buffer to no tensor (the first tensor starts at 0)";
      } else if (begin > expected) {
        message = at + " leave bytes [" + std::to_string(expected) + ", " + std::to_string(begin) +
                  ") to no tensor after tensor " + quote(prev->name) + " " +
                  offsets_to_string(prev->offsets[0], prev->offsets[1]);
      } else if (begin == prev->offsets[0] && end == prev->offsets[1]) {
        message = at + " alias the bytes of tensor " + quote(prev->name);
      } else {
        message = at + " overlap tensor " + quote(prev->name) + " " +
                  offsets_to_string(prev->offsets[0], prev->offsets[1]);
      }
      throw Error(ErrorCode::OffsetsNotContiguous, message);
    }
    expected = end;
    prev = &e;
  }

  // exact end: the tensors cover the data buffer exactly.
  if (expected != data_size) {
    std::string what = context + ": the tensors end at byte " + std::to_string(expected) +
                       " of the data buffer, which has " + std::to_string(data_size) + " bytes";
    if (expected > data_size) throw Error(ErrorCode::Truncated, what + " (truncated file?)");
    throw Error(ErrorCode::TrailingBytes,
                what + " (" + std::to_string(data_size - expected) + " trailing bytes)");
  }

  SafetensorsHeader header;
  header.metadata = std::move(handler.metadata());
  header.entries.reserve(raw.size());
  for (size_t i : order) {
    RawEntry& e = raw[i];
    SafetensorsEntry out;
    out.name = std::move(e.name);
    out.dtype = *e.dtype;
    out.shape.assign(e.dims.begin(), e.dims.end());  // each checked <= 2^63-1
    out.begin = e.offsets[0];
    out.end = e.offsets[1];
    header.entries.push_back(std::move(out));
  }
  return header;
}

}  // namespace grouplin
