# loom_install.cmake: what `cmake --install build --prefix P` puts under P: the public headers,
# libloom (shared, exporting only loom_*, and static), the loom tool, a CMake package
# (find_package(loom) gives loom::loom, the shared library, and loom::loom_static) and loom.pc
# (shared) and loom-static.pc (static) for pkg-config. All describe the dependencies libloom was
# built with, and are relocatable (found relative to where they are installed).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS loom loom_shared EXPORT loomTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/loom DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(LOOM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${LOOM_CMAKE_DIR})

# what the static library's users must find too (the shared one carries its own)
set(LOOM_HAVE_OPENMP ${OpenMP_C_FOUND})
set(LOOM_HAVE_ZLIB ${ZLIB_FOUND})
set(LOOM_HAVE_MPI ${MPI_C_FOUND})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/loomConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/loomConfig.cmake INSTALL_DESTINATION ${LOOM_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/loomConfigVersion.cmake
                                 VERSION ${LOOM_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/loomConfig.cmake ${CMAKE_BINARY_DIR}/loomConfigVersion.cmake
        DESTINATION ${LOOM_CMAKE_DIR})

# pkg-config: loom.pc's -lloom is the shared library, its Libs.private what a static link
# needs; a linker given -lloom takes libloom.so where both exist, so loom-static.pc names
# libloom.a itself (with the same dependencies): `pkg-config --libs loom-static`.
set(LOOM_PC_PRIVATE "-lpthread -lm")
foreach(lib ${LOOM_EXTRA_LIBS})
  if(lib STREQUAL "OpenMP::OpenMP_C")
    string(APPEND LOOM_PC_PRIVATE " ${OpenMP_C_FLAGS}")
  elseif(lib STREQUAL "ZLIB::ZLIB")
    string(APPEND LOOM_PC_PRIVATE " -lz")
  elseif(lib STREQUAL "MPI::MPI_C")
    foreach(m ${MPI_C_LIBRARIES})
      string(APPEND LOOM_PC_PRIVATE " ${m}")
    endforeach()
  else()
    string(APPEND LOOM_PC_PRIVATE " ${lib}")
  endif()
endforeach()
configure_file(${CMAKE_SOURCE_DIR}/cmake/loom.pc.in ${CMAKE_BINARY_DIR}/loom.pc @ONLY)
configure_file(${CMAKE_SOURCE_DIR}/cmake/loom-static.pc.in ${CMAKE_BINARY_DIR}/loom-static.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/loom.pc ${CMAKE_BINARY_DIR}/loom-static.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
