# Run with cmake -P: CORE_DIR. Fails naming every file and line of core/ (sources,
# headers and its CMakeLists.txt) that holds intrinsics, their headers, inline
# assembly, CPUID/XGETBV, vector register names or ISA compile flags.
set(_isa "immintrin|x86intrin|[a-z0-9]+intrin\\.h|cpuid\\.h|_mm[0-9]*_[a-z]|__m(64|128|256|512)|__builtin_ia32|__asm|asm[ \t]*(volatile|goto)?[ \t]*\\(|xgetbv|__cpuid|[xyz]mm[0-9]|target\\(\"(arch|avx|sse|amx|fma|f16c)|-m(avx|amx|sse|fma|f16c|arch=)")
file(GLOB_RECURSE _files LIST_DIRECTORIES false ${CORE_DIR}/*.h ${CORE_DIR}/*.hpp ${CORE_DIR}/*.cpp ${CORE_DIR}/*.c
     ${CORE_DIR}/*.inc ${CORE_DIR}/CMakeLists.txt ${CORE_DIR}/*.cmake)
set(_bad "")
foreach(f IN LISTS _files)
  file(STRINGS ${f} _hits REGEX "${_isa}")
  foreach(h IN LISTS _hits)
    string(APPEND _bad "\n  ${f}: ${h}")
  endforeach()
endforeach()
list(LENGTH _files _n)
if(_n EQUAL 0)
  message(FATAL_ERROR "no files found under ${CORE_DIR}")
endif()
if(_bad)
  message(FATAL_ERROR "core/ must hold no instruction-set code (move it to probes/ or a backend):${_bad}")
endif()
message(STATUS "${_n} files under core/, none with instruction-set code")
