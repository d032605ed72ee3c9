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

}  // namespace grouplin
