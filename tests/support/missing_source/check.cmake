# cmake -DSRC=... -DBIN=... -P check.cmake: configures SRC and passes only when
# the configure step fails with dsc_test's "source ... is missing" message.
file(REMOVE_RECURSE ${BIN})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "configuring a test with a missing source succeeded:\n${out}${err}")
endif()
if(NOT err MATCHES "test test_not_written: source test_not_written.c is missing")
  message(FATAL_ERROR "configure failed, but not for the missing source:\n${err}")
endif()
message(STATUS "a missing test source stops the configure step: ${rc}")
