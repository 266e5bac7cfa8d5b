# dsc_test(): how every test directory declares its tests (included by
# tests/CMakeLists.txt, and by tests/support/missing_source/ which checks that a
# missing source stops the configure step).
# dsc_test(NAME SOURCES... [INTERNAL] [NP n1 n2 ...] [TIMEOUT s] [ARGS ...])
#   Without NP: a unit test. With NP: one ctest per rank count, NAME_npN.
#   INTERNAL: the test calls functions no installed header declares.
function(dsc_test name)
  cmake_parse_arguments(T "INTERNAL" "TIMEOUT" "SOURCES;NP;ARGS;LABELS" ${ARGN})
  # A test whose source is missing is a configure error, never a silently dropped test.
  foreach(src ${T_SOURCES})
    if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${src})
      message(FATAL_ERROR "test ${name}: source ${src} is missing")
    endif()
  endforeach()
  add_executable(${name} ${T_SOURCES})
  if(T_INTERNAL)
    target_link_libraries(${name} PRIVATE dsc_test_support_internal)
    dsc_link_internals(${name})
  else()
    target_link_libraries(${name} PRIVATE dsc_test_support)
  endif()
  target_compile_definitions(${name} PRIVATE DSC_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                             DSC_BINARY_DIR="${CMAKE_BINARY_DIR}")
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_NP)
    add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
    set_tests_properties(${name} PROPERTIES LABELS "unit;${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                         ENVIRONMENT "OMP_NUM_THREADS=1;DSC_NUM_THREADS=1")
  else()
    foreach(np ${T_NP})
      add_test(NAME ${name}_np${np}
               COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${np}
                       $<TARGET_FILE:${name}> ${T_ARGS})
      set_tests_properties(${name}_np${np} PROPERTIES LABELS "mpi;${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                           PROCESSORS ${np} ENVIRONMENT "${DSC_MPIEXEC_ENV}")
    endforeach()
  endif()
endfunction()
