// Registry of kernel variants per op, for ahead-of-time compilation
// (rtcnorm.jit.precompile) with no GPU: each op lists the keys it may launch
// for a dtype, a row length and a set of modes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jit/kernel_key.h"
#include "ops/norm/plan/planner.h"

namespace rtcnorm {

using VariantFn = std::vector<jit::KernelKey> (*)(jit::DType dtype, int64_t hidden, const std::vector<NormMode>& modes,
                                                  int arch);
// Ops that normalize within groups of `group` columns (a divisor of hidden)
// instead of taking modes: the gated RMSNorm.
using GroupedVariantFn = std::vector<jit::KernelKey> (*)(jit::DType dtype, int64_t hidden, int64_t group, int arch);

// Called from static initializers of the op files.
bool register_variants(const char* op, VariantFn fn);
bool register_grouped_variants(const char* op, GroupedVariantFn fn);

// Keys of `op`, de-duplicated; throws for an unknown op, naming the known
// ones. group: a grouped op's group size (std::nullopt: hidden, one group a
// row); an error for the other ops and where it does not divide hidden.
std::vector<jit::KernelKey> variant_keys(const std::string& op, jit::DType dtype, int64_t hidden,
                                         const std::vector<NormMode>& modes, int arch,
                                         std::optional<int64_t> group = std::nullopt);
std::vector<std::string> variant_ops();

}  // namespace rtcnorm
