# lt_selftest_check.cmake: runs tests/harness/lt_selftest (a suite broken on purpose) and passes
# only if the harness stopped the broken test, reported it, ran the next one and exited 1
# (not a crash). Usage: cmake -DBIN=<path to lt_selftest> -P lt_selftest_check.cmake
execute_process(COMMAND ${BIN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(expect "FAIL broken_call_stops_its_test" "ok   next_test_still_runs" "1 passed, 1 failed")
foreach(line IN LISTS expect)
  string(FIND "${out}" "${line}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "lt_selftest: output lacks \"${line}\" (exit ${rc}):\n${out}\n${err}")
  endif()
endforeach()
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "lt_selftest: exit status ${rc}, expected 1 (a crash is not a failure report):\n${out}\n${err}")
endif()
message(STATUS "lt_selftest: the broken test was stopped and reported, the next one ran")
