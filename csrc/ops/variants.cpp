#include "ops/variants.h"

#include <c10/util/Exception.h>

#include <map>
#include <unordered_set>

namespace rtcnorm {
namespace {

struct Entry {
  VariantFn plain = nullptr;
  GroupedVariantFn grouped = nullptr;
};

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}

std::vector<std::string> grouped_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, e] : registry())
    if (e.grouped != nullptr) ops.push_back(name);
  return ops;
}

}  // namespace

bool register_variants(const char* op, VariantFn fn) {
  registry()[op].plain = fn;
  return true;
}

bool register_grouped_variants(const char* op, GroupedVariantFn fn) {
  registry()[op].grouped = fn;
  return true;
}

std::vector<std::string> variant_ops() {
  std::vector<std::string> ops;
  for (const auto& [name, e] : registry()) ops.push_back(name);
  return ops;
}

std::vector<jit::KernelKey> variant_keys(const std::string& op, jit::DType dtype, int64_t hidden,
                                         const std::vector<NormMode>& modes, int arch, std::optional<int64_t> group) {
  auto it = registry().find(op);
  TORCH_CHECK_VALUE(it != registry().end(), "rtcnorm.jit.precompile: unknown op '", op,
                    "'; known ops: ", c10::Join(", ", variant_ops()));
  const Entry& e = it->second;
  TORCH_CHECK_VALUE(e.grouped != nullptr || !group.has_value(),
                    "rtcnorm.jit.precompile: group_sizes is taken only by the ops that normalize in groups (",
                    c10::Join(", ", grouped_ops()), "), not by '", op, "'");
  TORCH_CHECK_VALUE(!group.has_value() || (*group >= 1 && hidden % *group == 0),
                    "rtcnorm.jit.precompile: group_sizes must hold divisors of every hidden size, got group size ",
                    group.value_or(0), " for hidden size ", hidden);
  std::vector<jit::KernelKey> keys;
  std::unordered_set<jit::KernelKey, jit::KernelKeyHash> seen;
  const auto all = e.grouped != nullptr ? e.grouped(dtype, hidden, group.value_or(hidden), arch)
                                        : e.plain(dtype, hidden, modes, arch);
  for (const auto& k : all)
    if (seen.insert(k).second) keys.push_back(k);
  return keys;
}

}  // namespace rtcnorm
