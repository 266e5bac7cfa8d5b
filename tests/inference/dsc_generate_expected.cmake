# Runs `dsc-generate MODEL --prompt "ROMEO:" --max-new-tokens 20 --quiet` for
# MODEL = MODEL_DIR/gpt-moe and MODEL_DIR/mixtral and compares its output byte
# for byte with MODEL/expected.txt (written by test_dsc_moe from the training
# model's greedy continuation). Inputs: APP, MODEL_DIR.
foreach(arch gpt-moe mixtral)
  set(model ${MODEL_DIR}/${arch})
  execute_process(COMMAND ${APP} ${model} --prompt "ROMEO:" --max-new-tokens 20 --quiet
                  OUTPUT_VARIABLE actual ERROR_VARIABLE err RESULT_VARIABLE rc)
  file(READ ${model}/expected.txt expected)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dsc-generate ${model} exited with ${rc}: ${err}")
  elseif(NOT actual STREQUAL expected)
    message(FATAL_ERROR "dsc-generate ${model} printed\n${actual}\nexpected (the training model's greedy continuation)\n${expected}")
  endif()
  message(STATUS "dsc-generate ${arch}: ${actual}")
endforeach()
