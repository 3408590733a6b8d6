// Text a model wrote, made safe for a terminal and a log (zero-train's
// --sample).
#pragma once

#include <string>

namespace zero::tools {

// Valid UTF-8 as it is, but control characters other than newline and tab
// (C0, DEL and C1: an undertrained model emits them; they would move the
// cursor or ring the bell) and bytes that are not UTF-8 (a lone
// continuation byte, an overlong form, a surrogate, a sequence cut short)
// as \xNN, one byte at a time: the result is UTF-8 without controls.
std::string printable(const std::string& text);

}  // namespace zero::tools
