#include "ops/variants.h"

#include <c10/util/Exception.h>

#include <map>
#include <unordered_set>

namespace rtcnorm {
namespace {

std::map<std::string, VariantFn>& registry() {
  static std::map<std::string, VariantFn> r;
  return r;
}

}  // namespace

bool register_variants(const char* op, VariantFn fn) {
  registry()[op] = fn;
  return true;
}

std::vector<std::string> variant_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, fn] : registry()) ops.push_back(name);
  return ops;
}

std::vector<jit::KernelKey> variant_keys(const std::string& op, jit::DType dtype, int64_t hidden,
                                         const std::vector<NormMode>& modes, int arch) {
  auto it = registry().find(op);
  TORCH_CHECK_VALUE(it != registry().end(), "rtcnorm.jit.precompile: unknown op '", op,
                    "'; known ops: ", c10::Join(", ", variant_ops()));
  std::vector<jit::KernelKey> keys;
  std::unordered_set<jit::KernelKey, jit::KernelKeyHash> seen;
  for (const auto& k : it->second(dtype, hidden, modes, arch))
    if (seen.insert(k).second) keys.push_back(k);
  return keys;
}

}  // namespace rtcnorm
