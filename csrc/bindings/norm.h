// The norm planner's Python face: explain_norm, the design catalogue and the
// two overrides (rtcnorm.explain, rtcnorm._tuning).
#pragma once

#include <pybind11/pybind11.h>

#include "jit/kernel_key.h"

namespace rtcnorm {

void bind_norm(pybind11::module_& m, pybind11::object (*ptxas)(const jit::KernelKey&));

}  // namespace rtcnorm
