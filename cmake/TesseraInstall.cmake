# `cmake --install BUILD [--prefix PREFIX]`: the tessera tools, the bundled plugins and
# model, and the SDK a plugin author builds against — the public headers,
# libtessera_core (and its siblings libtessera_probes, libtessera_conformance,
# libtessera_quant, libtessera_kv, libtessera_text, libtessera_llm, libtessera_chat) with a versioned
# soname, a CMake package (find_package(tessera), tessera::plugin_abi, tessera::core,
# tessera::quant, tessera::kv, tessera::probes, tessera::conformance, tessera::text, tessera::llm,
# tessera::chat,
# tessera_add_backend_plugin()) and pkg-config files (tessera,
# tessera-probes, tessera-conformance).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# Always lib/ (not Debian's multiarch lib/x86_64-linux-gnu under /usr): tessera finds
# its plugins at <exe>/../lib/tessera/plugins.
set(CMAKE_INSTALL_LIBDIR lib)

# Before 1.0 every minor version may change the C++ interface (what a plugin written
# on core's C++ classes links; the C plugin ABI has its own version,
# TESSERA_PLUGIN_ABI_VERSION). The
# probes (tessera::probes: CPUID and OS support for a CPU plugin's probe, bandwidth and
# peak) and the conformance suite (tessera::conformance) sit beside the core: the
# bundled CPU plugins and the tools need them at run time, and an outside plugin may
# link them. The LLM runtime (tessera::llm: engine, models, generator) with the
# tokenizers (tessera::text) is what the tools run on, and the chat templates
# (tessera::chat) what the server renders prompts with. Each finds the core next to
# itself ($ORIGIN).
set(_tessera_sdk_libs tessera_core tessera_quant tessera_kv tessera_probes tessera_conformance tessera_text tessera_llm tessera_chat)
set_target_properties(${_tessera_sdk_libs} PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
set_target_properties(tessera_core PROPERTIES EXPORT_NAME core)
set_target_properties(tessera_quant PROPERTIES EXPORT_NAME quant INSTALL_RPATH "$ORIGIN")
set_target_properties(tessera_kv PROPERTIES EXPORT_NAME kv INSTALL_RPATH "$ORIGIN")
set_target_properties(tessera_probes PROPERTIES EXPORT_NAME probes INSTALL_RPATH "$ORIGIN")
set_target_properties(tessera_conformance PROPERTIES EXPORT_NAME conformance INSTALL_RPATH "$ORIGIN")
set_target_properties(tessera_text PROPERTIES EXPORT_NAME text INSTALL_RPATH "$ORIGIN")
set_target_properties(tessera_llm PROPERTIES EXPORT_NAME llm INSTALL_RPATH "$ORIGIN")
set_target_properties(tessera_chat PROPERTIES EXPORT_NAME chat INSTALL_RPATH "$ORIGIN")

# tessera::plugin_abi: the headers alone (an INTERFACE include folder), which is all a
# plugin speaking the C ABI (tessera/plugin_abi.h) needs; tessera_add_backend_plugin()
# builds on it and links no tessera library. Its own export set, so that
# find_package(tessera COMPONENTS plugin_abi) needs none of the C++ libraries'
# dependencies.
if(NOT TARGET tessera_plugin_abi)
  add_library(tessera_plugin_abi INTERFACE)
  target_include_directories(tessera_plugin_abi INTERFACE $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/core/include>
                                                          $<INSTALL_INTERFACE:include>)
  set_target_properties(tessera_plugin_abi PROPERTIES EXPORT_NAME plugin_abi)
endif()
install(TARGETS tessera_plugin_abi EXPORT tesseraPluginAbiTargets)
install(EXPORT tesseraPluginAbiTargets NAMESPACE tessera:: FILE tesseraPluginAbiTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)

install(TARGETS ${_tessera_sdk_libs} EXPORT tesseraTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# One include/tessera/ for all of them (their headers never share a name).
foreach(_dir core quant kv probes conformance text llm chat)
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/${_dir}/include/tessera DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(EXPORT tesseraTargets NAMESPACE tessera:: FILE tesseraTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/tesseraConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/tesseraConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/tesseraConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/tesseraConfig.cmake ${CMAKE_BINARY_DIR}/cmake/tesseraConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
configure_file(${CMAKE_SOURCE_DIR}/cmake/tessera.pc.in ${CMAKE_BINARY_DIR}/cmake/tessera.pc @ONLY)
configure_file(${CMAKE_SOURCE_DIR}/cmake/tessera-plugin-abi.pc.in ${CMAKE_BINARY_DIR}/cmake/tessera-plugin-abi.pc @ONLY)
# tessera-probes.pc and tessera-conformance.pc: the sibling libraries, each on top of tessera.pc.
foreach(_pc probes:machine_probes conformance:conformance_suite)
  string(REPLACE ":" ";" _pc ${_pc})
  list(GET _pc 0 TESSERA_PC_LIB)
  list(GET _pc 1 TESSERA_PC_WHAT)
  string(REPLACE "_" " " TESSERA_PC_WHAT ${TESSERA_PC_WHAT})
  configure_file(${CMAKE_SOURCE_DIR}/cmake/tessera-sibling.pc.in ${CMAKE_BINARY_DIR}/cmake/tessera-${TESSERA_PC_LIB}.pc @ONLY)
endforeach()
install(FILES ${CMAKE_BINARY_DIR}/cmake/tessera.pc ${CMAKE_BINARY_DIR}/cmake/tessera-probes.pc
              ${CMAKE_BINARY_DIR}/cmake/tessera-conformance.pc ${CMAKE_BINARY_DIR}/cmake/tessera-plugin-abi.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Tools find libtessera_core in ../lib and their plugins in ../lib/tessera/plugins.
foreach(t tessera tessera-gen)
  if(TARGET ${t})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
foreach(p backend_cpu_scalar backend_cpu_avx512 backend_cpu_amx backend_vulkan loader_gguf loader_safetensors)
  if(TARGET ${p})
    install(TARGETS ${p} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/tessera/plugins)
  endif()
endforeach()
install(FILES plugins.toml DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera)
install(FILES ${CMAKE_BINARY_DIR}/share/tessera/models/default.gguf
  DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera/models OPTIONAL)
