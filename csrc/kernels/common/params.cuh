// Kernel parameter blocks, shared verbatim by the host and NVRTC.
//
// Invariants:
// - Plain structs of fixed-width members only (pointers, long long, int,
//   float), so the host and device layouts agree; the host static_asserts the
//   sizes. Each kernel takes its block by value as its only parameter.
// - Nothing here is device-only code, so the host C++ build includes this file
//   too; the one function is constexpr and marked for both sides under NVRTC.
#pragma once

#if defined(__CUDACC_RTC__)
#define RTCNORM_HOST_DEVICE __host__ __device__
#else
#define RTCNORM_HOST_DEVICE
#endif

namespace rtcnorm {

// Where row r of a logical (rows x N) view starts, in elements:
//   (r / inner_rows) * outer_stride + (r % inner_rows) * inner_stride.
// Any tensor whose leading dims collapse into at most two strided groups maps
// this way without a copy (e.g. q sliced out of a fused qkv projection).
// inner_rows >= rows means a single stride: r * inner_stride.
struct RowMap {
  long long outer_stride;
  long long inner_stride;
  long long inner_rows;
};

// Template flag bits shared by the norm kernels.
enum NormFlags : unsigned {
  kHasWeight = 1u << 0,
  kHasBias = 1u << 1,
  kZeroCentered = 1u << 2,  // scale is (1 + weight)
  kResidual = 1u << 3,      // forward: h = x + residual is normalized and written
  kCachedRow = 1u << 4,     // the row stays in registers between passes
  kKeepGamma = 1u << 5,     // persistent CTA loads gamma/beta once
  kGradDh = 1u << 6,        // backward: add an incoming gradient of h to dx
  kWantDw = 1u << 7,        // backward: write dW partial rows
  kWantDb = 1u << 8,        // backward: write dB partial rows
  // Every row map the kernel reads (x; the residual in the forward) is one
  // stride: row r starts at r * inner_stride, so the row's address needs no
  // test of inner_rows first (RowMap). Set by the host only where both maps
  // are single-stride and the planner picks it (ops/norm/plan).
  kSingleStride = 1u << 9,
  kStreamStore = 1u << 10,     // outputs are stored evict-first (.cs): not re-read
  kPrefetchNext = 1u << 11,    // a cached grid-stride loop asks L2 for its next row block
  kSmemRow = 1u << 12,         // forward: the row stays in dynamic shared memory between passes
  kPrefetchAffine = 1u << 13,  // forward: gamma/beta lines are fetched into L1 beside the row's loads
  // log2 of the CTAs of a thread-block cluster that split each row's columns
  // (0: one CTA per row group; 1..3: clusters of 2, 4 or 8, sm_90+; 16 is
  // kCluster16). See common/cluster.cuh; the host launches with the same
  // cluster shape.
  kClusterBits = 3u << 14,
  // backward, cached rows: x, dy (and dh) are staged through a two-stage ring
  // in dynamic shared memory by cp.async, the next row block's copies in
  // flight while the CTA reduces and writes the current one.
  kStagedRow = 1u << 16,
  // LayerNorm forward, row cached in registers by one CTA: the mean from a
  // first row reduction, then the squared deviations from it in a second.
  kTwoPassStats = 1u << 17,
  // forward: x (and the residual) are read through L1 (an ordinary
  // ld.global for 16-bit rows, ld.global.nc for float32) rather than around
  // it (ld.global.nc.L1::no_allocate); chosen for inputs of 40 MB or more.
  kL1Allocate = 1u << 18,
  // backward, staged rows: the ring holds 2 + this field stages (2-5), so
  // that many rows' copies minus one are in flight while the CTA works on one.
  kRingExtraBits = 3u << 19,
  // backward, register rows of lone CTAs, few row blocks: the first
  // row_blocks CTAs compute dx only, the CTAs after them dW / dB of column
  // slices over every row, written as the gradients (norm/bwd_column_grads.cuh).
  kColumnGrads = 1u << 21,
  // backward, cached rows: the first pass keeps every element's x - mean and
  // dy (w * dy for RMSNorm) in registers as floats and adds its dW / dB terms
  // there, and gamma stays in registers for the CTA's life; the second pass
  // is the dx arithmetic alone.
  kKeepTerms = 1u << 22,
  // backward, cached rows, one CTA (or cluster) owning every row block: its
  // column sums are the gradients themselves, written to dw / db in the
  // weight dtype; no partial rows and no column reduce.
  kDirectGrads = 1u << 23,
  // forward, cached rows: gamma/beta are loaded into registers beside the
  // row's x (as stored) rather than after the row reduction.
  kPreloadAffine = 1u << 24,
  // forward: the output epilogue quantizes y (common/quant_math.cuh's
  // Recipe codes; 0: y in the input dtype), and kBlockedScales writes block
  // scales in cuBLAS's blocked layout rather than row-major
  // (norm/quant_epilogue.cuh). Bit positions are part of kernel keys and of
  // the disk cache's names.
  kQuantBits = 7u << 25,
  kBlockedScales = 1u << 28,
  // backward, staged column-cluster rows (kStagedRow with kClusterBits, a ring
  // of at least 3 stages): the cluster's row sums are collected one row block
  // later, so a CTA's dx of row block k waits for its peers' sums of k while
  // it sums row block k + 1 (norm/bwd_sliced_row.cuh).
  kDeferStats = 1u << 29,
  // The high bit of kClusterBits' log2: set alone (the two low bits clear),
  // a cluster of 16 CTAs splits each row (sm_90's non-portable size).
  kCluster16 = 1u << 30,
  // column slices (forward; backward with kDeferStats): the kClusterBits /
  // kCluster16 slices of a row are consecutive CTAs of one cooperative launch,
  // not a thread-block cluster, and their row sums meet through p.exchange
  // in global memory (common/grid_exchange.cuh): the grid may then hold a
  // slice on every SM, where clusters must each fit one GPC.
  kGridExchange = 1u << 31,
};
constexpr int kClusterShift = 14;
constexpr int kQuantShift = 25;
// kGridExchange: partials are kept by call modulo this many slots
// (common/grid_exchange.cuh gives the layout and why three).
constexpr int kGridExchangeSlots = 3;
// kGridExchange: tagged 8-byte words a slot holds for a partial of `floats`
// floats: one per float, padded to 2 or 4 so that every slot starts 16-byte
// aligned (Sum1 and Sum2: 16 bytes, the three moments of LayerNorm: 32).
constexpr RTCNORM_HOST_DEVICE int grid_slot_words_for(int floats) { return floats <= 2 ? 2 : 4; }
constexpr int kRingExtraShift = 19;

// Backward (norm/bwd_rows.cuh, BwdLayout; the planner sizes shared memory by it):
// a bundle is a set of row groups whose column sums are combined through
// shared memory: whole warps for TPR < 32 (the groups inside a warp are
// combined with shuffles first), whole groups otherwise.
constexpr RTCNORM_HOST_DEVICE int bwd_bundles(int tpr, int rows) { return tpr < 32 ? (tpr * rows) / 32 : rows; }

// Backward (norm/bwd_rows.cuh): a lone CTA that writes the gradients itself
// (kDirectGrads without a column cluster, so the grid and
// row_blocks are 1) from terms summed in its first pass (kKeepTerms), one
// bundle of columns wide (no shared-memory combine), stores them before the
// row reduction.
constexpr RTCNORM_HOST_DEVICE bool early_direct_grads(unsigned flags, int tpr, int rows) {
  return (flags & (kCachedRow | kKeepTerms | kDirectGrads)) == (kCachedRow | kKeepTerms | kDirectGrads) &&
         (flags & (kClusterBits | kCluster16)) == 0 && bwd_bundles(tpr, rows) == 1;
}

// flat_row (common/flat_stage.cuh): elements of one staging buffer, a row block
// of `rows` rows of n elements of esize bytes plus the parts of 16-byte
// pieces before and after it, in whole pieces. The planner sizes shared
// memory with it. Its ring has kFlatStages stages: one block's copies fly
// while the CTA works on another (more stages measured no faster). A forward
// row no register layout holds (its `vecs` vectors over `chunk` a chunk) is
// read from its stage in flat_chunks chunks, one row a CTA; its ring has one
// stage (the widest rows' stage fills shared memory).
constexpr int kFlatStages = 2;
constexpr RTCNORM_HOST_DEVICE int flat_buffer_elems(int rows, int n, int esize) {
  return (rows * n + 3 * (16 / esize) - 1) / (16 / esize) * (16 / esize);
}
constexpr RTCNORM_HOST_DEVICE int flat_chunks(int vecs, int chunk) { return (vecs + chunk - 1) / chunk; }
constexpr RTCNORM_HOST_DEVICE int flat_stages(int chunks) { return chunks > 1 ? 1 : kFlatStages; }

enum NormKind : int { kRmsNorm = 0, kLayerNorm = 1 };

struct NormFwdParams {
  // What the first row's loads need comes first: a kernel's parameters are
  // read through the constant cache, and fields read on the way to the first
  // load that sit in different constant lines miss one after the other
  // (H100: 2-7% off grids of 1-32 rows, docs/history.md entry 44).
  const void* x;
  RowMap x_map;
  long long rows;
  long long row_blocks;  // ceil(rows / ROWS)
  const void* weight;
  const void* bias;
  void* y;      // contiguous rows x N
  float* rstd;  // rows
  float* mean;  // rows, LayerNorm only (may be null)
  float eps;
  unsigned exchange_base;  // kGridExchange: this launch's tags are exchange_base + 1 + call
  const void* residual;
  RowMap residual_map;
  void* h;             // contiguous rows x N, written when kResidual
  unsigned* exchange;  // kGridExchange: tagged partials (ops/grid_exchange_buffers.h)
  // kPrefetchNext: row blocks from a CTA's row block to the one it prefetches
  // into L2; 0 (what the launcher passes): the grid's stride, a grid-stride
  // loop's own next row block.
  long long prefetch_ahead;
  // Quantized outputs (kQuantBits): y holds the codes; scales the per-row or
  // per-block scales; amax (zeroed by the host) the tensor's max |y| where
  // the recipe returns it; the per-tensor or NVFP4 global scale is
  // *qscale_ptr (a device tensor) or else qscale; scale_cols is the scale
  // matrix's row pitch (padded in the blocked layout).
  void* scales;
  float* amax;
  const float* qscale_ptr;
  float qscale;
  int scale_cols;
};

struct NormBwdParams {
  // Ordered as NormFwdParams: the first row's operands first.
  const void* x;  // the normalized input (h when the forward fused a residual)
  RowMap x_map;
  long long rows;
  long long row_blocks;
  const void* dy;  // contiguous rows x N
  const float* rstd;
  const void* weight;
  const float* mean;        // LayerNorm only
  void* dx;                 // contiguous rows x N
  float* partial_w;         // parts x N, when kWantDw (parts: gridDim.x, or gridDim.y when split)
  float* partial_b;         // parts x N, when kWantDb
  void* dw;                 // N, in the weight dtype: written instead of partial_w when kDirectGrads
  void* db;                 // N, likewise for partial_b
  const void* dh;           // contiguous rows x N, read when kGradDh
  float* row_coef;          // rows x 2 (c1, c2): the split backward's per-row coefficients
  long long rows_per_tile;  // split backward: rows per row tile (gridDim.y tiles)
  int col_vecs;             // kColumnGrads: vectors of columns a column CTA owns
  unsigned exchange_base;   // kGridExchange: this launch's tags are exchange_base + 1 + call
  unsigned* exchange;       // kGridExchange: tagged partials (ops/grid_exchange_buffers.h)
};

// Up to two (partial, out) pairs reduced by one launch; blockIdx.y picks one.
struct ColumnReduceParams {
  const float* partial[2];  // parts x cols, row-major
  void* out[2];             // cols
  int parts;
  int cols;
};

}  // namespace rtcnorm
