# Runs a command and checks how it ended: its exit code exactly and, if given, a regex its
# output (stdout and stderr together) must match. A crash, a signal or a different exit code
# fails, which a PASS_REGULAR_EXPRESSION or WILL_FAIL test would not notice.
#   cmake -DEXIT=N [-DEXPECT=REGEX] -P expect_exit.cmake -- COMMAND ARGS...
# REGEX is a CMake regex; keep semicolons out of it (CMake splits lists on them).
if(NOT DEFINED EXIT)
  message(FATAL_ERROR "expect_exit.cmake: -DEXIT=N is required")
endif()
set(command)
set(after_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_separator)
    string(REPLACE ";" "\\;" argument "${CMAKE_ARGV${i}}")  # one argument, not a list
    list(APPEND command "${argument}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "expect_exit.cmake: no command after --")
endif()

execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc STREQUAL "${EXIT}")
  message(FATAL_ERROR "expect_exit: '${command}' ended with '${rc}', expected exit code ${EXIT}")
endif()
if(DEFINED EXPECT AND NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "expect_exit: the output of '${command}' does not match: ${EXPECT}")
endif()
message("expect_exit: exit code ${rc}, as expected")
