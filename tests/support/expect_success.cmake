# Runs a command that must succeed: exit status 0 AND output (stdout or
# stderr) matching REGEX. PASS_REGULAR_EXPRESSION alone ignores the exit
# status, so a program that printed the line and then crashed would pass.
#   cmake -DREGEX=<regex> -P expect_success.cmake -- <command> <args>...
include(${CMAKE_CURRENT_LIST_DIR}/command_after_dashes.cmake)
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit status ${rc} (expected 0):\n${out}\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "exit status 0, but the output does not match '${REGEX}':\n${out}\n${err}")
endif()
message(STATUS "${out}")
