#include "zero/core/error.h"

namespace zero::detail {

// User errors carry only the message: it is written for the user, and the
// source location would be noise. The location is kept for internal errors,
// which are for us.
void throw_check_failure(const char* /*file*/, int /*line*/, const char* cond,
                         const std::string& msg) {
  if (msg.empty()) throw Error(std::string("check failed: ") + cond);
  throw Error(msg);
}

void throw_internal_failure(const char* file, int line, const char* cond,
                            const std::string& msg) {
  std::string text = std::string("zerocpp internal error at ") + file + ":" +
                     std::to_string(line) + ": " + cond;
  if (!msg.empty()) text += ": " + msg;
  text += " (this is a bug in zerocpp; please report it)";
  throw InternalError(text);
}

}  // namespace zero::detail
