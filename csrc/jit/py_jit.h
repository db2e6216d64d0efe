// The JIT's administration API for Python (rtcnorm._C), beside the op
// registration: warnings raised while it runs reach Python's `warnings`
// module from the calling thread, and precompile reports progress there.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "jit/kernel_key.h"

namespace rtcnorm::jit {

// precompile_keys with the GIL released. After each kernel, on this thread
// and with the GIL: pending signals are checked (Ctrl-C stops it) and
// progress(done, total) is called unless progress is None. The workers'
// warnings are then raised as Python UserWarnings.
std::vector<std::string> precompile_for_python(const std::vector<KernelKey>& keys, int threads,
                                               const pybind11::object& progress);

// Defines cache_dir, disk_cache_enabled, clear_cache, stats, reset_stats and
// the test-only _disk_cache_read on `m`.
void bind_cache(pybind11::module_& m);

}  // namespace rtcnorm::jit
