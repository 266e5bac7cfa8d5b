# Runs APP with the |-separated ARGS and passes only when it exits 0 and its
# standard output is, byte for byte, EXPECTED plus a newline, or the content
# of EXPECTED_FILE (ctest's PASS_REGULAR_EXPRESSION would ignore the exit
# status). Inputs: APP, ARGS, EXPECTED or EXPECTED_FILE.
string(REPLACE "|" ";" args "${ARGS}")
if(DEFINED EXPECTED_FILE)
  file(READ ${EXPECTED_FILE} expected)
else()
  set(expected "${EXPECTED}\n")
endif()
execute_process(COMMAND ${APP} ${args} OUTPUT_VARIABLE actual ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${APP} exited with ${rc}: ${err}")
elseif(NOT actual STREQUAL expected)
  message(FATAL_ERROR "${APP} printed\n${actual}\nexpected\n${expected}")
endif()
message(STATUS "${actual}")
