// rtcnorm._C's argument checks, for the fake impls and explain().
#pragma once

#include <pybind11/pybind11.h>

namespace rtcnorm {

void bind_arg_checks(pybind11::module_& m);

}  // namespace rtcnorm
