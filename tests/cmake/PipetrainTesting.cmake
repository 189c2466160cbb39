# Helpers every tests/<area>/CMakeLists.txt registers its tests with (included by
# tests/CMakeLists.txt, which sets PT_TEST_WORKDIR, PT_MPI_ENV and PT_MPICH_SUBSET).
#
# Arguments are parsed with PARSE_ARGV: a single argument holding a ';' (an expected message such
# as "unknown section [modle]; did you mean 'model'?", a launch prefix handed to a script as one
# string) stays one argument of the command instead of being split into several.

# pt_mpi_command(OUT NP): the launch prefix of an NP-rank run, Cabana-style:
#   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} NP ${MPIEXEC_PREFLAGS}
# for the tests that hand the launch to a script instead of running it (pt_add_mpi_test does).
function(pt_mpi_command out np)
  separate_arguments(_pre UNIX_COMMAND "${MPIEXEC_PREFLAGS}")
  set(${out} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${_pre} PARENT_SCOPE)
endfunction()

set(_pt_test_options RUN_SERIAL)
set(_pt_test_one_value NAME WORKING_DIRECTORY TIMEOUT SKIP_RETURN_CODE)
set(_pt_test_multi_value COMMAND LABELS ENVIRONMENT FIXTURES_REQUIRED FIXTURES_SETUP
    PASS_REGULAR_EXPRESSION)

# Sets the properties that pt_add_test or pt_add_mpi_test (the caller) parsed into arg_*.
# Unquoted values: an argument that holds a list (LABELS "pipeline;tp", a PASS_REGULAR_EXPRESSION
# with a ';') gives the property the same list that set_tests_properties() would.
function(_pt_set_test_properties name)
  if(arg_RUN_SERIAL)
    set_property(TEST ${name} PROPERTY RUN_SERIAL TRUE)
  endif()
  foreach(prop TIMEOUT SKIP_RETURN_CODE LABELS ENVIRONMENT FIXTURES_REQUIRED FIXTURES_SETUP
          PASS_REGULAR_EXPRESSION)
    if(DEFINED arg_${prop})
      set_property(TEST ${name} PROPERTY ${prop} ${arg_${prop}})
    endif()
  endforeach()
endfunction()

# pt_add_test(NAME name COMMAND cmd [arg...] [WORKING_DIRECTORY dir] [LABELS label...]
#             [TIMEOUT s] [ENVIRONMENT var=value...] [FIXTURES_REQUIRED f...]
#             [FIXTURES_SETUP f...] [PASS_REGULAR_EXPRESSION re...] [SKIP_RETURN_CODE code]
#             [RUN_SERIAL])
# add_test() and its properties in one call. WORKING_DIRECTORY defaults to PT_TEST_WORKDIR
# (build/tests), not add_test()'s folder of the registering file: the tests ran there when one
# file registered them all, and what they leave in their working directory stays where it was.
function(pt_add_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "${_pt_test_options}" "${_pt_test_one_value}"
                        "${_pt_test_multi_value}")
  if(arg_UNPARSED_ARGUMENTS OR NOT arg_NAME OR NOT arg_COMMAND)
    message(FATAL_ERROR "pt_add_test(${arg_NAME}): needs NAME and COMMAND; unknown arguments: "
                        "${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT DEFINED arg_WORKING_DIRECTORY)
    set(arg_WORKING_DIRECTORY ${PT_TEST_WORKDIR})
  endif()
  add_test(NAME ${arg_NAME} COMMAND ${arg_COMMAND} WORKING_DIRECTORY ${arg_WORKING_DIRECTORY})
  _pt_set_test_properties(${arg_NAME})
endfunction()

# pt_add_mpi_test(NAME name NP n COMMAND exe [arg...] [WRAPPER cmd [arg...]]
#                 [LABELS label...] [TIMEOUT s] [any other pt_add_test option])
# exe on n ranks: the command line is
#   [WRAPPER...] ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} n ${MPIEXEC_PREFLAGS} exe arg...
# WRAPPER runs the launch itself (integration/expect_exit.sh checking the exit code, cmake -E env
# setting a test-only switch for every rank). ENVIRONMENT is PT_MPI_ENV (Open MPI as root, no
# warnings about unused transports), followed by any given.
function(pt_add_mpi_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "${_pt_test_options}" "NP;${_pt_test_one_value}"
                        "WRAPPER;${_pt_test_multi_value}")
  if(arg_UNPARSED_ARGUMENTS OR NOT arg_NAME OR NOT arg_NP OR NOT arg_COMMAND)
    message(FATAL_ERROR "pt_add_mpi_test(${arg_NAME}): needs NAME, NP and COMMAND; unknown "
                        "arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  pt_mpi_command(launch ${arg_NP})
  if(NOT DEFINED arg_WORKING_DIRECTORY)
    set(arg_WORKING_DIRECTORY ${PT_TEST_WORKDIR})
  endif()
  add_test(NAME ${arg_NAME} COMMAND ${arg_WRAPPER} ${launch} ${arg_COMMAND}
           WORKING_DIRECTORY ${arg_WORKING_DIRECTORY})
  set(arg_ENVIRONMENT ${PT_MPI_ENV} ${arg_ENVIRONMENT})
  _pt_set_test_properties(${arg_NAME})
  # ctest -j: an NP-rank run takes NP slots (more than -j: it runs alone)
  set_property(TEST ${arg_NAME} PROPERTY PROCESSORS ${arg_NP})
endfunction()

# pt_label_mpich_subset(): tools/check runs `ctest -L mpich` on a second build with MPICH; the
# tests of the calling folder that a PT_MPICH_SUBSET pattern matches get the label. Call it last
# in every folder: it sees only that folder's tests (a test's properties can be set only where it
# was added), and appends after every LABELS set before it.
function(pt_label_mpich_subset)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    foreach(re ${PT_MPICH_SUBSET})
      if(t MATCHES "${re}")
        set_property(TEST ${t} APPEND PROPERTY LABELS mpich)
        break()
      endif()
    endforeach()
  endforeach()
endfunction()
