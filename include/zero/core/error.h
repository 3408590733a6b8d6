// Errors in zerocpp come in three kinds, as in LibTorch (TORCH_CHECK vs
// TORCH_INTERNAL_ASSERT):
//
//   ZERO_CHECK(cond, msg...)          a user error: bad input, bad config, a
//                                     resource that ran out. Throws zero::Error
//                                     whose message says what is wrong and how
//                                     to fix it. Always on.
//   ZERO_INTERNAL_ASSERT(cond, msg...) a bug in zerocpp. Throws
//                                     zero::InternalError naming file:line.
//                                     Always on.
//   ZERO_DCHECK(cond)                 an invariant on a hot path; compiled out
//                                     unless NDEBUG is undefined.
//
// The message arguments are streamed (operator<<), so any printable value can
// be passed: ZERO_CHECK(n > 0, "batch size must be positive, got ", n).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace zero {

// A user-facing error: the message names the input and the fix.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A broken invariant inside zerocpp (please report it).
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (void)(os << ... << args);
  return os.str();
}
inline std::string str_cat() { return {}; }

[[noreturn]] void throw_check_failure(const char* file, int line, const char* cond,
                                      const std::string& msg);
[[noreturn]] void throw_internal_failure(const char* file, int line, const char* cond,
                                         const std::string& msg);

}  // namespace detail
}  // namespace zero

#define ZERO_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (__builtin_expect(!(cond), 0)) {                                                \
      ::zero::detail::throw_check_failure(__FILE__, __LINE__, #cond,                   \
                                          ::zero::detail::str_cat(__VA_ARGS__));       \
    }                                                                                  \
  } while (0)

#define ZERO_INTERNAL_ASSERT(cond, ...)                                                \
  do {                                                                                 \
    if (__builtin_expect(!(cond), 0)) {                                                \
      ::zero::detail::throw_internal_failure(__FILE__, __LINE__, #cond,                \
                                             ::zero::detail::str_cat(__VA_ARGS__));    \
    }                                                                                  \
  } while (0)

#ifdef NDEBUG
#define ZERO_DCHECK(cond) \
  do {                    \
  } while (0)
#else
#define ZERO_DCHECK(cond) ZERO_INTERNAL_ASSERT(cond)
#endif
