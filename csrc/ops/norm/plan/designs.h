// The norm design catalogue (docs/designs.md): kernel structures, their knobs, resources and kernel keys.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "jit/kernel_key.h"
#include "ops/norm/plan/problem.h"

namespace rtcnorm {

// Forward designs (kernels/norm/: the file of the same stem).
enum class FwdDesign : uint8_t {
  kRegisterRow,  // a row group per CTA, the row held in registers: x read once
  kSmemRow,      // the CTA's rows held in shared memory: x read once, rows too long for registers
  kSlicedRow,    // a row split over the CTAs of a cluster (or a cooperative group), each slice in registers
  kReloadRow,    // x read twice (statistics, then normalize): any width, any mode
  kFlatRow,      // a row block staged through shared memory in 16-byte pieces of the flat tensor: any width
};
// Backward designs; dW / dB are reduced in a fixed order (deterministic).
enum class BwdDesign : uint8_t {
  kRegisterRow,  // persistent CTAs, x and dy of a row held in registers
  kStagedRow,    // as kRegisterRow, x and dy staged through a cp.async ring in shared memory
  kSlicedRow,    // a row split over a cluster's CTAs (or a cooperative group), each slice staged or in registers
  kSplitRow,     // a per-row coefficient kernel, then a column kernel (vecs_per_thread: rows in flight)
  kColumnGrads,  // few row blocks: row CTAs write dx, column CTAs beside them dW / dB over every row
  kFlatRow,      // as the forward's flat_row, with register dW / dB sums as kRegisterRow
};
constexpr int kFwdDesignCount = 5, kBwdDesignCount = 6;
inline int design_count(bool forward) { return forward ? kFwdDesignCount : kBwdDesignCount; }
const char* design_name(bool forward, int design);
// The knobs a design may declare. 0 / false is "not set" for overrides.
enum class Knob : uint8_t {
  kVecsPerThread,  // vectors a thread holds of a row (or a slice, or a chunk)
  kCtaThreads,     // threads of a CTA: rows_per_cta = cta_threads / threads_per_row
  kBlocksPerSm,    // launch bounds: CTAs an SM the registers are sized for
  kSlices,         // CTAs splitting a row (kSlicedRow)
  kRingStages,     // stages of a shared-memory ring
  kPersistent,     // 1: a grid of SMs x occupancy striding over row blocks; 0: one CTA per row block
  kGridExchange,   // 1: slices are CTAs of one cooperative launch meeting in global memory; 0: a cluster
};
constexpr int kKnobCount = 7;
const char* knob_name(Knob k);
struct Knobs {
  int vecs_per_thread = 0, cta_threads = 0, blocks_per_sm = 0, slices = 1, ring_stages = 0;
  int persistent = 0, grid_exchange = 0;  // 0 / 1
  int get(Knob k) const;
  void set(Knob k, int v);
};
// A measured choice (rtcnorm.tune) for one exact problem on one GPU model.
struct TunedChoice {
  int design = -1;  // FwdDesign / BwdDesign as int
  Knobs knobs;
};
// One (design, knobs) candidate, its resources and the cost model's terms.
struct Candidate {
  int design = 0;  // FwdDesign or BwdDesign, as int
  Knobs knobs;
  jit::KernelKey key;                  // the kernel (the split design: its column kernel)
  int64_t row_blocks = 0;              // ceil(rows / rows_per_cta)
  int64_t grid = 0;                    // CTAs launched (persistent: SMs x occupancy, capped)
  size_t smem = 0;                     // dynamic shared memory a CTA
  int regs = 0;                        // estimated registers a thread needs
  int64_t col_vecs = 0, col_ctas = 0;  // kColumnGrads: vectors of columns a column CTA owns; column CTAs
  double bytes = 0;                    // DRAM bytes moved, partial rows and re-reads included
  double in_flight = 0;                // bytes a resident SM has requested at once
  double efficiency = 0;               // fraction of copy bandwidth the model expects
  double us = 0;                       // the model's estimate
};
// A problem's candidates in catalogue order; dominated designs left out unless `every` (a forced design).
void fwd_candidates(const NormProblem& p, NormMode mode, const Gpu& gpu, std::vector<Candidate>& out, bool every);
void bwd_candidates(const NormProblem& p, const BwdWants& w, const Gpu& gpu, std::vector<Candidate>& out, bool every);
void cost_fwd(const NormProblem& p, const Gpu& gpu, Candidate& c);
void cost_bwd(const NormProblem& p, const BwdWants& w, const Gpu& gpu, Candidate& c);
jit::KernelKey split_coef_key(const NormProblem& p, int arch);
unsigned declared_knobs(bool forward, int design);  // bit k: the design declares Knob k (others' overrides refused)
// Shared by the designs (planner.cpp): a layout of rows split over `slices` CTAs, about `cta_threads` threads at
// about `nv_target` vectors each; a kernel key on it (`nv` vectors a thread, `flags` and the problem's own).
struct Layout {
  int tpr = 1, rows = 1, nv = 1, threads = 1, slices = 1;
  int64_t row_blocks = 0;
};
jit::KernelKey norm_key(const NormProblem& p, const jit::KernelFamily* family, const Layout& l, int nv, unsigned flags,
                        int variant, int arch);
Layout layout_of(const NormProblem& p, int slices, int nv_target, int cta_threads);
// f(l, nv) for each target `nv` and CTA size, no row wider than its CTA (bar the smallest); pick() drops repeats.
template <class F>
void each_layout(const NormProblem& p, int slices, std::initializer_list<int> nv_targets, F f) {
  for (int nv : nv_targets)
    for (int cta : {128, 256, 512, 1024}) {
      const Layout l = layout_of(p, slices, nv, cta);
      if (l.tpr <= cta || cta == 128) f(l, nv);
    }
}
// flat_row (its ring: kFlatStages, common/params.cuh) is planned where the rows' widest access is narrow (measured,
// docs/designs.md): under 4 bytes forward, under 8 backward. The cost model prices such accesses below copy.
inline bool narrow_access(const NormProblem& p, bool forward) { return p.vec() * p.esize() < (forward ? 4 : 8); }
// Rows split into s slices: equal, or the last short (never empty; no ring, no prefetch). Scalar rows: equal only.
inline bool can_slice(const NormProblem& p, int s) {
  return p.nvec() % s == 0 || (p.vec() > 1 && ceil_div(p.nvec(), s) * (s - 1) < p.nvec());
}
inline bool flat_worth(const NormProblem& p, bool forward) { return p.flat && narrow_access(p, forward); }
// Appends a candidate of `design` on layout `l` (`blocks`: launch bounds).
Candidate& add_candidate(std::vector<Candidate>& out, const NormProblem& p, int design, const jit::KernelFamily* family,
                         const Layout& l, int nv, int blocks, int regs, unsigned flags, int arch);
// flat_row's candidate (persistent) on layout `l`, `streams` tensors staged and the column sums' `combine` bytes
// reusing them; none (false) where a thread holds over `nv` vectors, it spills or overflows shared memory.
bool add_flat(std::vector<Candidate>& out, const NormProblem& p, int design, const jit::KernelFamily* family,
              const Layout& l, int nv, int regs, int streams, int64_t combine, unsigned flags, const Gpu& gpu);
// A sliced row's candidate as a cooperative launch's, its slices meeting in global memory.
Candidate grid_exchange(Candidate c);

}  // namespace rtcnorm
