#include "zero/version.h"

namespace zero {

const char* version() { return ZERO_VERSION_STRING; }

}  // namespace zero
