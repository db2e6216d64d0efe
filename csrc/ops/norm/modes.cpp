// The forward's user-facing modes as strings (modes.h).
#include "ops/norm/modes.h"

#include <c10/util/Exception.h>

#include <string>

namespace rtcnorm {

NormMode parse_mode(const std::optional<c10::string_view>& mode, const char* op) {
  if (!mode.has_value()) return NormMode::kAuto;
  const std::string m(mode->data(), mode->size());
  if (m == "static_persistent") return NormMode::kStaticPersistent;
  if (m == "multi_wave_reload") return NormMode::kMultiWaveReload;
  if (m == "multi_wave_cached") return NormMode::kMultiWaveCached;
  TORCH_CHECK_VALUE(false, "rtcnorm.", op, ": mode must be None, 'static_persistent', 'multi_wave_reload' or ",
                    "'multi_wave_cached', got '", m, "'");
}

const char* mode_name(NormMode m) {
  switch (m) {
    case NormMode::kAuto:
      return "auto";
    case NormMode::kStaticPersistent:
      return "static_persistent";
    case NormMode::kMultiWaveReload:
      return "multi_wave_reload";
    case NormMode::kMultiWaveCached:
      return "multi_wave_cached";
  }
  return "?";
}

}  // namespace rtcnorm
