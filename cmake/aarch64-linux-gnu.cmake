# Cross-compiling for 64-bit ARM Linux with Debian's cross toolchain (g++-aarch64-linux-gnu),
# e.g. `cmake -S . -B build-aarch64 --toolchain cmake/aarch64-linux-gnu.cmake` (`make test-cross`).
# Where qemu-user is installed, ctest runs the target's programs through qemu-aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(GROUPLIN_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${GROUPLIN_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${GROUPLIN_CROSS_TRIPLE}-g++)

# Libraries and headers of the target only (Debian's cross packages keep them here); programs of
# the host.
set(CMAKE_FIND_ROOT_PATH /usr/${GROUPLIN_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# nlohmann-json is header-only and architecture-independent: the host's package serves (its
# /usr/include is already on the cross compiler's search path).
set(nlohmann_json_DIR /usr/share/cmake/nlohmann_json CACHE PATH "nlohmann-json's CMake package")

find_program(GROUPLIN_QEMU qemu-${CMAKE_SYSTEM_PROCESSOR})
if(GROUPLIN_QEMU)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${GROUPLIN_QEMU} -L /usr/${GROUPLIN_CROSS_TRIPLE})
endif()
