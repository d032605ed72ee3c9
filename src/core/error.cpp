#include "grouplin/error.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <utility>
#include <vector>

#include "core/parser_text.hpp"
#include "core/utf8.hpp"

namespace grouplin {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
#define GROUPLIN_NAME_ENTRY(name) \
  case ErrorCode::name:           \
    return #name;
    GROUPLIN_ERROR_CODES(GROUPLIN_NAME_ENTRY)
#undef GROUPLIN_NAME_ENTRY
  }
  return "Unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(std::string(error_code_name(code)) + ": " + message),
      code_(code),
      message_(message),
      problems_{{code, "", message}} {}

Error::Error(ErrorCode code, const std::string& message, std::vector<Problem> problems)
    : std::runtime_error(std::string(error_code_name(code)) + ": " + message),
      code_(code),
      message_(message),
      problems_(std::move(problems)) {
  if (problems_.empty()) problems_.push_back({code, "", message});
}

namespace {

// Code points printed as \uNNNN although they are valid: C1 controls (U+0080..U+009F; U+009B
// is CSI on terminals that honour 8-bit controls) and the bidirectional controls that reorder
// what a line appears to say (LRM, RLM, ALM, embeddings, overrides, isolates).
bool is_hidden_control(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

void escape_into(std::string& out, std::string_view text, bool escape_quote) {
  static constexpr char kHex[] = "0123456789abcdef";
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    const size_t len = utf8::char_length(text, i);
    if (len == 0 || b < 0x20 || b == 0x7F) {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
      ++i;
      continue;
    }
    if (len > 1) {
      const char32_t cp = utf8::decode(text, i, len);
      if (is_hidden_control(cp)) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        out += buf;
      } else {
        out.append(text.substr(i, len));
      }
      i += len;
      continue;
    }
    if (b == '\\' || (escape_quote && b == '"')) out += '\\';
    out += static_cast<char>(b);
    ++i;
  }
}

// Bytes of `text` kept when cutting it after at most `max` bytes on a character boundary, so
// that a multi-byte character is not shown as \xNN bytes (bytes that are no UTF-8 count as one).
size_t cut_on_character(std::string_view text, size_t max) {
  if (text.size() <= max) return text.size();
  size_t cut = 0;
  while (true) {
    const size_t len = std::max<size_t>(utf8::char_length(text, cut), 1);
    if (cut + len > max) return cut;
    cut += len;
  }
}

}  // namespace

std::string escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  escape_into(out, text, false);
  return out;
}

std::string quote(std::string_view name) {
  constexpr size_t kMaxShown = 512;
  const size_t cut = cut_on_character(name, kMaxShown);
  std::string out;  // built by appends: GCC 12 warns (-Wrestrict) falsely on "\"" + std::string
  out.reserve(cut + 2);
  out += '"';
  escape_into(out, name.substr(0, cut), true);
  out += '"';
  if (cut < name.size()) out += "... (" + std::to_string(name.size()) + " bytes)";
  return out;
}

namespace detail {

std::string parser_text(std::string_view what) {
  const size_t cut = cut_on_character(what, kMaxParserText);
  std::string out;
  out.reserve(cut + 3);
  escape_into(out, what.substr(0, cut), false);
  if (cut < what.size()) out += "...";
  return out;
}

}  // namespace detail
}  // namespace grouplin

namespace grouplin {
namespace {

// Lower case, '-' as '_': "qwen3-moe" and "Qwen3_MoE" are one name to a reader.
std::string folded_name(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string did_you_mean(std::string_view got, const std::vector<std::string>& known) {
  const std::string g = folded_name(got);
  const size_t limit = std::max<size_t>(1, g.size() / 3);
  const std::string* best = nullptr;
  size_t best_distance = limit + 1;
  for (const std::string& k : known) {
    const size_t d = edit_distance(g, folded_name(k));
    if (d < best_distance) {
      best_distance = d;
      best = &k;
    }
  }
  return best ? "; did you mean " + quote(*best) + "?" : "";
}

}  // namespace grouplin
