# Runs a command that must fail: a non-zero exit status AND output (stdout or
# stderr) matching REGEX. PASS_REGULAR_EXPRESSION alone would pass a command
# that prints the message and then exits 0.
#   cmake -DREGEX=<regex> [-DWORKDIR=<dir>] [-DSTATUS=<n>] -P expect_failure.cmake -- <command> <args>...
# (STATUS: that exit status exactly, e.g. 2 for a usage error)
# (arguments must not contain a semicolon: CMake would split them)
include(${CMAKE_CURRENT_LIST_DIR}/../support/command_after_dashes.cmake)
if(NOT WORKDIR)
  set(WORKDIR "${CMAKE_CURRENT_BINARY_DIR}")
endif()
execute_process(COMMAND ${cmd} WORKING_DIRECTORY "${WORKDIR}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status, got 0:\n${out}\n${err}")
endif()
if(DEFINED STATUS AND NOT rc EQUAL STATUS)
  message(FATAL_ERROR "expected exit status ${STATUS}, got ${rc}:\n${out}\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "exit status ${rc}, but the output does not match '${REGEX}':\n${out}\n${err}")
endif()
message(STATUS "failed as expected (status ${rc}): ${err}")
