// Names, knobs and the layout helpers every norm design shares.
#include <algorithm>

#include "ops/norm/plan/designs.h"

namespace rtcnorm {

namespace {

constexpr const char* kFwdNames[kFwdDesignCount] = {"register_row", "smem_row", "sliced_row", "reload_row"};
constexpr const char* kBwdNames[kBwdDesignCount] = {"register_row", "staged_row", "sliced_row", "split_row",
                                                    "column_grads"};
constexpr const char* kKnobNames[kKnobCount] = {"vecs_per_thread", "cta_threads", "blocks_per_sm", "slices",
                                                "ring_stages",     "persistent",  "grid_exchange"};
// Knobs in Knob order.
int Knobs::*const kFields[kKnobCount] = {&Knobs::vecs_per_thread, &Knobs::cta_threads, &Knobs::blocks_per_sm,
                                         &Knobs::slices,          &Knobs::ring_stages, &Knobs::persistent,
                                         &Knobs::grid_exchange};

// Declared knobs, one bit per Knob, by design.
constexpr unsigned bit(Knob k) { return 1u << static_cast<int>(k); }
constexpr unsigned kRowKnobs = bit(Knob::kVecsPerThread) | bit(Knob::kCtaThreads) | bit(Knob::kBlocksPerSm);
constexpr unsigned kSliceKnobs = kRowKnobs | bit(Knob::kSlices) | bit(Knob::kGridExchange) | bit(Knob::kRingStages);
constexpr unsigned kFwdKnobs[kFwdDesignCount] = {
    kRowKnobs | bit(Knob::kPersistent),  // register_row
    kRowKnobs,                           // smem_row
    kSliceKnobs,                         // sliced_row
    kRowKnobs | bit(Knob::kPersistent),  // reload_row
};
constexpr unsigned kBwdKnobs[kBwdDesignCount] = {
    kRowKnobs,                           // register_row
    kRowKnobs | bit(Knob::kRingStages),  // staged_row
    kSliceKnobs,                         // sliced_row
    bit(Knob::kVecsPerThread),           // split_row: rows in flight a thread
    kRowKnobs,                           // column_grads
};

}  // namespace

int design_count(bool forward) { return forward ? kFwdDesignCount : kBwdDesignCount; }
const char* design_name(bool forward, int design) { return forward ? kFwdNames[design] : kBwdNames[design]; }
const char* knob_name(Knob k) { return kKnobNames[static_cast<int>(k)]; }
int Knobs::get(Knob k) const { return this->*kFields[static_cast<int>(k)]; }
void Knobs::set(Knob k, int v) { this->*kFields[static_cast<int>(k)] = v; }
unsigned declared_knobs(bool forward, int design) { return forward ? kFwdKnobs[design] : kBwdKnobs[design]; }

jit::KernelKey norm_key(const NormProblem& p, const jit::KernelFamily* family, int arch) {
  jit::KernelKey k;
  k.family = family;
  k.dtype = p.dtype;
  k.wdtype = p.has_weight || p.has_bias ? p.wdtype : p.dtype;
  k.hidden = static_cast<int32_t>(p.hidden);
  k.arch = static_cast<int16_t>(arch);
  k.vec = static_cast<int16_t>(p.vec());
  return k;
}

int threads_per_row(int64_t nvec, int nv) {
  const int64_t want = ceil_div(nvec, std::max(1, nv));
  if (want <= 32) return static_cast<int>(pow2_ceil(want));
  if (want >= 1024) return 1024;
  // Any multiple of 32 with nv / 2 .. nv vectors a thread: the fewest idle lanes.
  int best = 0;
  int64_t best_idle = -1;
  for (int v = std::max(1, nv); v >= std::max(1, nv / 2); --v) {
    const int64_t t = std::min<int64_t>(1024, ceil_div(ceil_div(nvec, v), 32) * 32);
    const int64_t idle = t * ceil_div(nvec, t) - nvec;
    if (best_idle < 0 || idle < best_idle) best = static_cast<int>(t), best_idle = idle;
  }
  return best;
}

// The register file is four partitions of 16384; a CTA's warps spread over
// them round-robin and a warp takes registers in steps of 8 a thread, at
// most 255 (sm_80 - sm_100).
int regs_at(int threads, int blocks) {
  const int warps = ((threads + 31) / 32) * std::max(1, blocks);
  const int per_partition = (warps + 3) / 4;
  return std::min(255, 16384 / (per_partition * 32) / 8 * 8);
}

int blocks_leaving(int threads, int blocks, int need) {
  while (blocks > 1 && regs_at(threads, blocks) < need) --blocks;
  return std::max(1, blocks);
}

}  // namespace rtcnorm
