// The forward's user-facing modes (NormMode, ops/norm/plan/problem.h) as strings.
#pragma once

#include <c10/util/string_view.h>

#include <optional>

#include "ops/norm/plan/problem.h"

namespace rtcnorm {

// Parses the user's mode string; throws naming `op` and listing valid values.
NormMode parse_mode(const std::optional<c10::string_view>& mode, const char* op);
const char* mode_name(NormMode m);

}  // namespace rtcnorm
