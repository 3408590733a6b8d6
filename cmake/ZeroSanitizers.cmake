# ZERO_SANITIZE=address|undefined|thread instruments our own code. LibTorch
# itself is not instrumented; that is fine for ASan/UBSan, and TSan is meant
# for the threaded kernels (optim/, comm/), whose tests do not need LibTorch.
if(ZERO_SANITIZE)
  if(ZERO_SANITIZE STREQUAL "address")
    set(_zero_san_flags -fsanitize=address -fno-omit-frame-pointer)
  elseif(ZERO_SANITIZE STREQUAL "undefined")
    set(_zero_san_flags -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  elseif(ZERO_SANITIZE STREQUAL "thread")
    set(_zero_san_flags -fsanitize=thread)
  else()
    message(FATAL_ERROR "ZERO_SANITIZE='${ZERO_SANITIZE}' is not known: use address, undefined or thread")
  endif()
  add_compile_options(${_zero_san_flags})
  add_link_options(${_zero_san_flags})
  message(STATUS "zerocpp: sanitizer ${ZERO_SANITIZE}")
endif()
