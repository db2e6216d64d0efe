// The softmax planner's Python face: explain_softmax, the design catalogue
// and the two overrides (rtcnorm.softmax.explain, rtcnorm._tuning).
#pragma once

#include <pybind11/pybind11.h>

#include "jit/kernel_key.h"

namespace rtcnorm {

// `ptxas` reports a planned kernel's registers and spills (explain's
// resources=True).
void bind_softmax(pybind11::module_& m, pybind11::object (*ptxas)(const jit::KernelKey&));

}  // namespace rtcnorm
