# Run with cmake -P: BUILD_DIR (a built tessera tree), SOURCE_DIR, WORK (scratch).
file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
set(ex ${WORK}/example)

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(STEP_OUT "${out}" PARENT_SCOPE)
endfunction()

# 1. The SDK installs: headers, the versioned core library, the CMake package, pkg-config.
step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/tessera/backend.h include/tessera/plugin_abi.h lib/libtessera_core.so
          include/tessera/hwprobe.h lib/libtessera_probes.so include/tessera/conformance.h
          lib/libtessera_conformance.so lib/pkgconfig/tessera-probes.pc lib/pkgconfig/tessera-conformance.pc
          lib/cmake/tessera/tesseraConfig.cmake lib/cmake/tessera/tesseraConfigVersion.cmake
          lib/cmake/tessera/tesseraPluginAbiTargets.cmake
          lib/pkgconfig/tessera.pc lib/pkgconfig/tessera-plugin-abi.pc bin/tessera
          lib/tessera/plugins/backend_cpu_scalar.so)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "the install lacks ${f}")
  endif()
endforeach()
file(GLOB sonames ${prefix}/lib/libtessera_core.so.*)
if(NOT sonames)
  message(FATAL_ERROR "libtessera_core has no versioned soname")
endif()
# Every installed binary finds the tessera libraries it links inside the prefix (the
# CPU plugins need libtessera_probes, the CLI also libtessera_conformance). Under
# `tessera` they would load anyway (it has them loaded already), so ask ldd.
find_program(LDD ldd)
if(LDD)
  file(GLOB installed_bins ${prefix}/bin/tessera ${prefix}/lib/*.so ${prefix}/lib/tessera/plugins/*.so)
  foreach(b IN LISTS installed_bins)
    execute_process(COMMAND ${LDD} ${b} OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(REGEX MATCHALL "libtessera_[a-z_]+\\.so[.0-9]* => [^ \n]+" found "${out}")
    foreach(f IN LISTS found)
      if(NOT f MATCHES " => ${prefix}/")
        message(FATAL_ERROR "${b} does not find its tessera libraries in the prefix:\n${out}${err}")
      endif()
    endforeach()
    if(out MATCHES "not found")
      message(FATAL_ERROR "${b} lacks a library:\n${out}${err}")
    endif()
  endforeach()
endif()

# 2. The example builds out of tree (the default generator, nothing from the source tree
#    but the example's own folder), with its mutant, and links no tessera library.
step("configure the example" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/backend_plugin -B ${ex}
     -DCMAKE_PREFIX_PATH=${prefix} -DEXAMPLE_CPU_MUTANT=ON -DCMAKE_BUILD_TYPE=Release)
step("build the example" ${CMAKE_COMMAND} --build ${ex})
# It speaks the C plugin ABI alone (find_package(tessera COMPONENTS plugin_abi)): it
# needs no tessera library.
find_program(READELF readelf)
if(READELF)
  foreach(so example_cpu example_cpu_mutant)
    execute_process(COMMAND ${READELF} -d ${ex}/${so}.so RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "readelf -d ${ex}/${so}.so failed (${rc}):\n${err}")
    endif()
    if(out MATCHES "NEEDED[^\n]*libtessera")
      message(FATAL_ERROR "${so}.so links a tessera library; a C-ABI plugin must not:\n${out}")
    endif()
  endforeach()
endif()

# The same source builds with nothing but pkg-config's flags for the C ABI.
find_program(PKG_CONFIG pkg-config)
find_program(CXX_COMPILER NAMES c++ g++ clang++)
if(PKG_CONFIG AND CXX_COMPILER)
  step("pkg-config --cflags tessera-plugin-abi" ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${prefix}/lib/pkgconfig
       ${PKG_CONFIG} --cflags --libs tessera-plugin-abi)
  string(STRIP "${STEP_OUT}" abi_flags)
  if(NOT abi_flags MATCHES "^-I[^ ]*include$")
    message(FATAL_ERROR "tessera-plugin-abi.pc should give one include folder and no library, gave: ${abi_flags}")
  endif()
  step("build the example with pkg-config's flags" ${CXX_COMPILER} -std=c++20 -O1 -shared -fPIC ${abi_flags}
       ${SOURCE_DIR}/examples/backend_plugin/example_cpu.cpp -o ${WORK}/example_cpu_pc.so)
endif()

# 3. Dropped in, it is found, and it passes conformance on the cases it accepts.
step("conformance on example_cpu" ${CMAKE_COMMAND} -E env TESSERA_PLUGIN_PATH=${ex}
     ${prefix}/bin/tessera conformance --backend example_cpu -q)
if(NOT STEP_OUT MATCHES "example_cpu: [0-9]+ cases, ([0-9]+) pass, 0 fail")
  message(FATAL_ERROR "unexpected conformance summary:\n${STEP_OUT}")
endif()
if(CMAKE_MATCH_1 LESS 50)
  message(FATAL_ERROR "only ${CMAKE_MATCH_1} cases verified on example_cpu:\n${STEP_OUT}")
endif()
message(STATUS "example_cpu: ${CMAKE_MATCH_1} cases pass")

# 4. The mutant (one MatMul output element off by 1e-3) must fail conformance.
execute_process(COMMAND ${CMAKE_COMMAND} -E env TESSERA_PLUGIN_PATH=${ex}
                ${prefix}/bin/tessera conformance --backend example_cpu_mutant -q
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT out MATCHES "example_cpu_mutant: [0-9]+ cases, [0-9]+ pass, ([1-9][0-9]*) fail")
  message(FATAL_ERROR "conformance did not fail the mutant (exit ${rc}):\n${out}\n${err}")
endif()
message(STATUS "example_cpu_mutant: ${CMAKE_MATCH_1} cases fail, as they must")
