# Runs `dsc-generate MODEL --prompt "ROMEO:" --max-new-tokens 20 --quiet` for
# MODEL = MODEL_DIR/gpt-moe and MODEL_DIR/mixtral and compares its output byte
# for byte with MODEL/expected.txt (written by test_dsc_moe from the training
# model's greedy continuation). Inputs: APP, MODEL_DIR; optional LAUNCH (a
# launcher command, `|`-separated, e.g. mpirun|-np|4) and EXTRA (more
# dsc-generate arguments, `|`-separated, e.g. --tp|2|--ep|2).
foreach(arch gpt-moe mixtral)
  set(model ${MODEL_DIR}/${arch})
  string(REPLACE "|" ";" launch "${LAUNCH}")
  string(REPLACE "|" ";" extra "${EXTRA}")
  execute_process(COMMAND ${launch} ${APP} ${model} --prompt "ROMEO:" --max-new-tokens 20 --quiet ${extra}
                  OUTPUT_VARIABLE actual ERROR_VARIABLE err RESULT_VARIABLE rc)
  file(READ ${model}/expected.txt expected)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "dsc-generate ${model} exited with ${rc}: ${err}")
  elseif(NOT actual STREQUAL expected)
    message(FATAL_ERROR "dsc-generate ${model} printed\n${actual}\nexpected (the training model's greedy continuation)\n${expected}")
  endif()
  message(STATUS "dsc-generate ${arch}: ${actual}")
endforeach()
