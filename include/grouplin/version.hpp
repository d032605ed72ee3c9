// GroupLin's version, as the build was configured (CMake's project version), and as
// `grouplin --version` prints it.
//
//   std::cout << "GroupLin " << grouplin::version() << "\n";   // "GroupLin 0.1.0"
#pragma once

#include <string_view>

namespace grouplin {

// "MAJOR.MINOR.PATCH" of the library this program links.
std::string_view version();

}  // namespace grouplin
