#include "cli/rules_option.hpp"

#include <algorithm>
#include <charconv>

#include "grouplin/error.hpp"

namespace grouplin::cli {

std::vector<LayoutRules> rules_from_option(const std::string& value) {
  if (value.empty() || value == "auto") return {};
  const std::vector<std::string> builtins = builtin_rule_names();
  std::vector<LayoutRules> out;
  size_t begin = 0;
  while (begin <= value.size()) {
    const size_t end = std::min(value.find(',', begin), value.size());
    const std::string item = value.substr(begin, end - begin);
    if (item.empty()) {
      throw Error(ErrorCode::InvalidArgument,
                  "--rules " + quote(value) + ": an empty item; expected names or files");
    }
    const bool builtin = std::find(builtins.begin(), builtins.end(), item) != builtins.end();
    out.push_back(builtin ? builtin_rules(item) : load_rules(item));
    begin = end + 1;
  }
  return out;
}

ExpertRange experts_from_option(const std::string& value) {
  const size_t colon = value.find(':');
  ExpertRange r;
  auto parse = [](std::string_view s, int64_t& v) {
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && p == s.data() + s.size();
  };
  if (colon == std::string::npos || !parse(std::string_view(value).substr(0, colon), r.begin) ||
      !parse(std::string_view(value).substr(colon + 1), r.end) || r.begin < 0 || r.end <= r.begin) {
    throw Error(ErrorCode::InvalidArgument,
                "--experts " + quote(value) + ": expected BEGIN:END with 0 <= BEGIN < END");
  }
  return r;
}

}  // namespace grouplin::cli
