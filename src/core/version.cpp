#include "grouplin/version.hpp"

namespace grouplin {

std::string_view version() { return GROUPLIN_VERSION; }

}  // namespace grouplin
