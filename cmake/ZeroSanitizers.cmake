# ZERO_SANITIZE=address|undefined|thread, or a comma-separated list such as
# "address,undefined" (one build that runs both: what scripts/sanitize does),
# instruments our own code. LibTorch itself is not instrumented; that is fine
# for ASan/UBSan, and TSan is meant for the threaded kernels (optim/, comm/)
# and the engine's own threads, run with one OpenMP thread
# (scripts/sanitize tsan). thread cannot be combined with address.
if(ZERO_SANITIZE)
  string(REPLACE "," ";" _zero_san_list "${ZERO_SANITIZE}")
  set(_zero_san_flags)
  foreach(_san IN LISTS _zero_san_list)
    if(_san STREQUAL "address")
      list(APPEND _zero_san_flags -fsanitize=address)
    elseif(_san STREQUAL "undefined")
      list(APPEND _zero_san_flags -fsanitize=undefined -fno-sanitize-recover=undefined)
    elseif(_san STREQUAL "thread")
      list(APPEND _zero_san_flags -fsanitize=thread)
    else()
      message(FATAL_ERROR "ZERO_SANITIZE='${ZERO_SANITIZE}': '${_san}' is not known; use address, "
                          "undefined or thread, or a comma-separated list such as address,undefined")
    endif()
  endforeach()
  if("thread" IN_LIST _zero_san_list AND "address" IN_LIST _zero_san_list)
    message(FATAL_ERROR "ZERO_SANITIZE='${ZERO_SANITIZE}': thread and address cannot be combined")
  endif()
  list(APPEND _zero_san_flags -fno-omit-frame-pointer)
  add_compile_options(${_zero_san_flags})
  add_link_options(${_zero_san_flags})
  message(STATUS "zerocpp: sanitizer ${ZERO_SANITIZE}")
endif()
