// The gated RMSNorm's Python face (rtcnorm._C): its argument checks for the
// fake impls (python/rtcnorm/gated.py) and its kernel plans for tests.
#pragma once

#include <pybind11/pybind11.h>

#include "jit/kernel_key.h"

namespace rtcnorm {

void bind_gated(pybind11::module_& m, pybind11::object (*ptxas)(const jit::KernelKey&));

}  // namespace rtcnorm
