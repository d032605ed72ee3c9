# Installing GroupLin: headers, the static and shared libraries, a CMake package (grouplinConfig:
# grouplin::grouplin, grouplin::grouplin_shared, grouplin::grouplin_mpi when built), a pkg-config
# file and the grouplin command.
#
#   cmake --install build --prefix /opt/grouplin
#   find_package(grouplin 0.1 REQUIRED)  +  target_link_libraries(app PRIVATE grouplin::grouplin)
#   pkg-config --cflags --libs grouplin
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(grouplin_targets grouplin)
if(TARGET grouplin_shared)
  list(APPEND grouplin_targets grouplin_shared)
endif()
# Expert parallelism (grouplin::grouplin_mpi) when it was built: its users need MPI too, which
# grouplinConfig.cmake then finds.
set(GROUPLIN_PACKAGE_WITH_MPI OFF)
if(TARGET grouplin_mpi)
  list(APPEND grouplin_targets grouplin_mpi)
  set(GROUPLIN_PACKAGE_WITH_MPI ON)
endif()
install(TARGETS ${grouplin_targets} EXPORT grouplinTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/grouplin
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
set(grouplin_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/grouplin)
install(EXPORT grouplinTargets NAMESPACE grouplin:: DESTINATION ${grouplin_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/grouplinConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/grouplinConfig.cmake
                              INSTALL_DESTINATION ${grouplin_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/grouplinConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/grouplinConfig.cmake
              ${PROJECT_BINARY_DIR}/grouplinConfigVersion.cmake
        DESTINATION ${grouplin_cmake_dir})
# Relocatable: the prefix is found from where the .pc file lies, so `cmake --install --prefix`
# anywhere gives a working file.
file(RELATIVE_PATH grouplin_pc_to_prefix /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
configure_file(${PROJECT_SOURCE_DIR}/cmake/grouplin.pc.in ${PROJECT_BINARY_DIR}/grouplin.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/grouplin.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(TARGET grouplin_cli)
  install(TARGETS grouplin_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
