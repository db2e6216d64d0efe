#include "ops/norm_plan_memo.h"

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "jit/kernel_cache.h"
#include "ops/norm/tuned_plans.h"

namespace rtcnorm {
namespace {

// Everything a plan depends on, packed into plain integers.
struct PlanQuery {
  int64_t rows;
  int64_t hidden;
  uint32_t shape;  // kind, dtypes, max_vec, features, mode / gradients asked for
  int32_t device;
  bool operator==(const PlanQuery& o) const {
    return rows == o.rows && hidden == o.hidden && shape == o.shape && device == o.device;
  }
};

struct PlanQueryHash {
  size_t operator()(const PlanQuery& q) const noexcept {
    uint64_t h = static_cast<uint64_t>(q.rows) * 0x9E3779B97F4A7C15ull;
    h ^= static_cast<uint64_t>(q.hidden) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
    h ^= (uint64_t{q.shape} << 32 | static_cast<uint32_t>(q.device)) + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

PlanQuery query_of(const NormProblem& p, unsigned extra, int device) {
  // 1 + 4 + 4 + 5 + 6 + 4 = 24 bits of problem, then the caller's bits.
  uint32_t bits = static_cast<uint32_t>(p.kind);
  bits = bits << 4 | static_cast<uint32_t>(p.dtype);
  bits = bits << 4 | static_cast<uint32_t>(p.wdtype);
  bits = bits << 5 | static_cast<uint32_t>(p.max_vec);
  bits = bits << 6 | (p.has_weight ? 1u : 0u) | (p.has_bias ? 2u : 0u) | (p.zero_centered ? 4u : 0u) |
         (p.residual ? 8u : 0u) | (p.single_stride ? 16u : 0u) | (p.flat ? 32u : 0u);
  bits = bits << 4 | p.recipe() | ((p.quant & kBlockedScales) != 0 ? 8u : 0u);
  return PlanQuery{p.rows, p.hidden, bits << 4 | extra, device};
}

template <typename Plan>
class PlanMemo {
 public:
  template <typename Make>
  Plan get(const PlanQuery& q, Make&& make) {
    {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      auto it = plans_.find(q);
      if (it != plans_.end()) return it->second;
    }
    Plan plan = make();
    std::unique_lock<std::shared_mutex> lock(mutex_);
    if (plans_.size() >= kNormPlanMemoEntries) plans_.clear();
    plans_.emplace(q, plan);
    return plan;
  }
  void clear() {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    plans_.clear();
  }

 private:
  std::shared_mutex mutex_;
  std::unordered_map<PlanQuery, Plan, PlanQueryHash> plans_;
};

PlanMemo<NormFwdPlan>& fwd_memo() {
  static PlanMemo<NormFwdPlan> memo;
  return memo;
}

PlanMemo<NormBwdPlan>& bwd_memo() {
  static PlanMemo<NormBwdPlan> memo;
  return memo;
}

}  // namespace

NormFwdPlan memo_plan_norm_fwd(const NormProblem& p, NormMode requested, int device) {
  static_assert(static_cast<int>(NormMode::kMultiWaveCached) < 16, "a mode fits the query's four low bits");
  const unsigned extra = static_cast<unsigned>(requested);
  return fwd_memo().get(query_of(p, extra, device), [&] {
    const jit::DeviceInfo& info = jit::device_info(device);
    const std::optional<TunedChoice> tuned = find_tuned(true, p, extra, info);
    return plan_norm_fwd(p, requested, info.sm_count, info.arch, false, tuned ? &*tuned : nullptr);
  });
}

NormBwdPlan memo_plan_norm_bwd(const NormProblem& p, bool want_dw, bool want_db, bool grad_dh, int device) {
  const unsigned extra = (want_dw ? 1u : 0u) | (want_db ? 2u : 0u) | (grad_dh ? 4u : 0u);
  return bwd_memo().get(query_of(p, extra, device), [&] {
    const jit::DeviceInfo& info = jit::device_info(device);
    const std::optional<TunedChoice> tuned = find_tuned(false, p, extra, info);
    return plan_norm_bwd(p, want_dw, want_db, grad_dh, info.sm_count, info.arch, false, tuned ? &*tuned : nullptr);
  });
}

void clear_norm_plan_memo() {
  fwd_memo().clear();
  bwd_memo().clear();
}

}  // namespace rtcnorm
