// gin/host/env.hpp — reading gin's environment variables: an empty variable
// counts as unset, and a malformed number is a gin::Error naming the variable.
#pragma once

#include "gin/core/error.hpp"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
#include <system_error>

namespace gin {
namespace detail {

// An empty variable counts as unset: job scripts often export VAR= to clear it.
inline std::optional<std::string> envVar(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// Strict decimal: "3 ", "0x3" or "+3" are launcher mistakes to report, not to guess around.
inline long long parseEnvInt(const char* name, const std::string& value, long long lo, long long hi) {
  long long v = 0;
  const char* b = value.data();
  const char* e = b + value.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e)
    throw Error(std::string(name) + "=\"" + value + "\" is not a decimal integer; fix the launcher's environment");
  if (v < lo || v > hi)
    throw Error(std::string(name) + "=" + value + " is out of range (expected " + std::to_string(lo) + ".." +
                std::to_string(hi) + "); fix the launcher's environment");
  return v;
}

}  // namespace detail
}  // namespace gin
