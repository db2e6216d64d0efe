// Registry of kernel variants per op, for ahead-of-time compilation
// (rtcnorm.jit.precompile) with no GPU: each op lists the keys it may launch
// for a dtype, a row length and a set of modes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jit/kernel_key.h"
#include "ops/norm/plan/planner.h"

namespace rtcnorm {

using VariantFn = std::vector<jit::KernelKey> (*)(jit::DType dtype, int64_t hidden, const std::vector<NormMode>& modes,
                                                  int arch);

// Called from static initializers of the op files.
bool register_variants(const char* op, VariantFn fn);

// Keys of `op`, de-duplicated; throws for an unknown op, naming the known ones.
std::vector<jit::KernelKey> variant_keys(const std::string& op, jit::DType dtype, int64_t hidden,
                                         const std::vector<NormMode>& modes, int arch);
std::vector<std::string> variant_ops();

}  // namespace rtcnorm
