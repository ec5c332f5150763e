# `cmake --install BUILD [--prefix PREFIX]`: the tessera tools, the bundled plugins and
# model, and the SDK a plugin author builds against — the public headers,
# libtessera_core with a versioned soname, a CMake package (find_package(tessera),
# tessera::core, tessera_add_backend_plugin()) and a pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# Always lib/ (not Debian's multiarch lib/x86_64-linux-gnu under /usr): tessera finds
# its plugins at <exe>/../lib/tessera/plugins.
set(CMAKE_INSTALL_LIBDIR lib)

# Before 1.0 every minor version may change the plugin-facing C++ interface.
set_target_properties(tessera_core PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR} EXPORT_NAME core)

install(TARGETS tessera_core EXPORT tesseraTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/core/include/tessera DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tesseraTargets NAMESPACE tessera:: FILE tesseraTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/tesseraConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/tesseraConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/tesseraConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/tesseraConfig.cmake ${CMAKE_BINARY_DIR}/cmake/tesseraConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
configure_file(${CMAKE_SOURCE_DIR}/cmake/tessera.pc.in ${CMAKE_BINARY_DIR}/cmake/tessera.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cmake/tessera.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Tools find libtessera_core in ../lib and their plugins in ../lib/tessera/plugins.
foreach(t tessera tessera-gen)
  if(TARGET ${t})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
foreach(p backend_cpu_scalar backend_cpu_avx512 backend_cpu_amx backend_vulkan loader_gguf)
  if(TARGET ${p})
    install(TARGETS ${p} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/tessera/plugins)
  endif()
endforeach()
install(FILES plugins.toml DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera)
install(FILES ${CMAKE_BINARY_DIR}/share/tessera/models/default.gguf
  DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera/models OPTIONAL)
