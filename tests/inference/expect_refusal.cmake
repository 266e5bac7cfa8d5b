# Runs APP with ARGS (a ;-list) and passes only when it exits non-zero AND its
# stderr contains EXPECT: a refusal test that a crash, a hang cut by ctest's
# timeout, or a success all fail. Inputs: APP, ARGS, EXPECT.
execute_process(COMMAND ${APP} ${ARGS} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0)
  message(FATAL_ERROR "${APP} ${ARGS} succeeded; expected a refusal containing \"${EXPECT}\"\n${out}")
endif()
string(FIND "${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${APP} ${ARGS} exited with ${rc} but its message lacks \"${EXPECT}\":\n${err}")
endif()
message(STATUS "refused as expected (exit ${rc}): ${err}")
