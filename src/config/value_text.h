// How a JSON value from the user's file is quoted in a message.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zero::config::detail {

// The value as JSON, short: strings cut at 60 characters, arrays and objects
// cut at a few elements and two levels ("[[1, 2], ...]"). Never recurses
// deeper than that, whatever the nesting of the input.
std::string describe_value(const nlohmann::ordered_json& value);

// A key from the user's file as it appears in a message: control characters
// escaped, cut at 60 characters.
std::string describe_key(std::string_view key);

}  // namespace zero::config::detail
