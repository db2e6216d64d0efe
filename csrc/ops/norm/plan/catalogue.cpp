// Names, knobs and the layout helpers every norm design shares.
#include <algorithm>

#include "ops/norm/plan/designs.h"

namespace rtcnorm {

const char* design_name(FwdDesign d) {
  switch (d) {
    case FwdDesign::kRegisterRow:
      return "register_row";
    case FwdDesign::kSmemRow:
      return "smem_row";
    case FwdDesign::kSlicedRow:
      return "sliced_row";
    case FwdDesign::kReloadRow:
      return "reload_row";
  }
  return "?";
}

const char* design_name(BwdDesign d) {
  switch (d) {
    case BwdDesign::kRegisterRow:
      return "register_row";
    case BwdDesign::kStagedRow:
      return "staged_row";
    case BwdDesign::kSlicedRow:
      return "sliced_row";
    case BwdDesign::kSplitRow:
      return "split_row";
    case BwdDesign::kColumnGrads:
      return "column_grads";
  }
  return "?";
}

const char* knob_name(Knob k) {
  switch (k) {
    case Knob::kVecsPerThread:
      return "vecs_per_thread";
    case Knob::kCtaThreads:
      return "cta_threads";
    case Knob::kBlocksPerSm:
      return "blocks_per_sm";
    case Knob::kSlices:
      return "slices";
    case Knob::kRingStages:
      return "ring_stages";
    case Knob::kPersistent:
      return "persistent";
    case Knob::kGridExchange:
      return "grid_exchange";
  }
  return "?";
}

int Knobs::get(Knob k) const {
  switch (k) {
    case Knob::kVecsPerThread:
      return vecs_per_thread;
    case Knob::kCtaThreads:
      return cta_threads;
    case Knob::kBlocksPerSm:
      return blocks_per_sm;
    case Knob::kSlices:
      return slices;
    case Knob::kRingStages:
      return ring_stages;
    case Knob::kPersistent:
      return persistent ? 1 : 0;
    case Knob::kGridExchange:
      return grid_exchange ? 1 : 0;
  }
  return 0;
}

void Knobs::set(Knob k, int v) {
  switch (k) {
    case Knob::kVecsPerThread:
      vecs_per_thread = v;
      break;
    case Knob::kCtaThreads:
      cta_threads = v;
      break;
    case Knob::kBlocksPerSm:
      blocks_per_sm = v;
      break;
    case Knob::kSlices:
      slices = v;
      break;
    case Knob::kRingStages:
      ring_stages = v;
      break;
    case Knob::kPersistent:
      persistent = v != 0;
      break;
    case Knob::kGridExchange:
      grid_exchange = v != 0;
      break;
  }
}

// Declared knobs, one bit per Knob, by design.
static constexpr unsigned bit(Knob k) { return 1u << static_cast<int>(k); }
constexpr unsigned kRowKnobs = bit(Knob::kVecsPerThread) | bit(Knob::kCtaThreads) | bit(Knob::kBlocksPerSm);

bool declares(FwdDesign d, Knob k) {
  static constexpr unsigned kDeclared[kFwdDesignCount] = {
      kRowKnobs | bit(Knob::kPersistent),                                                  // register_row
      kRowKnobs,                                                                           // smem_row
      kRowKnobs | bit(Knob::kSlices) | bit(Knob::kGridExchange) | bit(Knob::kRingStages),  // sliced_row
      kRowKnobs | bit(Knob::kPersistent),                                                  // reload_row
  };
  return (kDeclared[static_cast<int>(d)] & bit(k)) != 0;
}

bool declares(BwdDesign d, Knob k) {
  static constexpr unsigned kDeclared[kBwdDesignCount] = {
      kRowKnobs,                                                                           // register_row
      kRowKnobs | bit(Knob::kRingStages),                                                  // staged_row
      kRowKnobs | bit(Knob::kSlices) | bit(Knob::kGridExchange) | bit(Knob::kRingStages),  // sliced_row
      bit(Knob::kVecsPerThread),                                                           // split_row
      kRowKnobs,                                                                           // column_grads
  };
  return (kDeclared[static_cast<int>(d)] & bit(k)) != 0;
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
