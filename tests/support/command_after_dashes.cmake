# For `cmake -D... -P script.cmake -- <command> <args>...` scripts: sets `cmd`
# to the command and its arguments after `--` (arguments must not contain a
# semicolon: CMake would split them). Included by expect_success.cmake and
# expect_failure.cmake.
set(cmd "")
set(after_dashes FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_dashes)
    list(APPEND cmd "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()
if(cmd STREQUAL "")
  message(FATAL_ERROR "${CMAKE_CURRENT_LIST_FILE}: no command after --")
endif()
