# Runs inside ctest (included from the CTestTestfile): lists test_conformance's tests
# (which depend on the plugins present now) and adds one ctest test per GoogleTest
# test with its labels. Inputs: TESSERA_CONFORMANCE_EXE, TESSERA_CONFORMANCE_DIR.
if(NOT EXISTS "${TESSERA_CONFORMANCE_EXE}")
  # Shown as "Not Run (Disabled)": a partial build does not fail ctest, but says so.
  add_test(test_conformance_NOT_BUILT "${TESSERA_CONFORMANCE_EXE}")
  set_tests_properties(test_conformance_NOT_BUILT PROPERTIES LABELS "unit;conformance" DISABLED TRUE)
  return()
endif()
execute_process(COMMAND "${TESSERA_CONFORMANCE_EXE}" --gtest_list_tests
                WORKING_DIRECTORY "${TESSERA_CONFORMANCE_DIR}"
                OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 60)
if(NOT _rc EQUAL 0)
  add_test(test_conformance_LIST_FAILED "${TESSERA_CONFORMANCE_EXE}" --gtest_list_tests)
  set_tests_properties(test_conformance_LIST_FAILED PROPERTIES LABELS "unit;conformance")
  return()
endif()
string(REPLACE "\n" ";" _lines "${_out}")
set(_suite "")
foreach(_line IN LISTS _lines)
  if(_line MATCHES "^([A-Za-z0-9_/]+)\\.$")
    set(_suite "${CMAKE_MATCH_1}")
  elseif(_line MATCHES "^  ([A-Za-z0-9_/]+)" AND NOT _suite STREQUAL "")
    set(_name "${_suite}.${CMAKE_MATCH_1}")
    add_test("${_name}" "${TESSERA_CONFORMANCE_EXE}" "--gtest_filter=${_name}")
    set(_labels "unit;conformance")
    if(_suite MATCHES "^Conformance/(.+)$")
      list(APPEND _labels "backend:${CMAKE_MATCH_1}")
    endif()
    set_tests_properties("${_name}" PROPERTIES
      LABELS "${_labels}"
      WORKING_DIRECTORY "${TESSERA_CONFORMANCE_DIR}"
      SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
      TIMEOUT 120)
  endif()
endforeach()
