#include "grouplin/error.hpp"

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
      message_(message) {}

std::string quoted(std::string_view name) {
  std::string s;  // built by appends: GCC 12 warns (-Wrestrict) falsely on "\"" + std::string
  s.reserve(name.size() + 2);
  s += '"';
  s += name;
  s += '"';
  return s;
}

}  // namespace grouplin
