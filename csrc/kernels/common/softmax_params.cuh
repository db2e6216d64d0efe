// Parameter blocks of the softmax kernels, shared by the host (C++) and the
// device (NVRTC) code.
//
// Invariants:
// - Plain structs of fixed-width members only, so host and device layouts
//   agree; the host static_asserts the sizes. Each kernel takes its block by
//   value as its only parameter.
// - Row indices fit in 31 bits (the host refuses more rows), so every
//   division of a row index is an unsigned 32-bit multiply-high (FastDiv).
// - Nothing here is device code, so the host C++ build includes this file too.
#pragma once

namespace rtcnorm {

// Division by a run-time constant d (1 <= d < 2^31) of numerators n < 2^31:
//   n / d == (umulhi(n, mul) + n) >> shift
// with shift = ceil(log2(d)) and mul = floor(2^32 * (2^shift - d) / d) + 1.
// The sum cannot overflow 32 bits: umulhi(n, mul) < n < 2^31.
struct FastDiv {
  unsigned d;
  unsigned mul;
  unsigned shift;
  unsigned pad_;
};

// Up to kMaxRowGroups strided groups of leading dims (innermost first) that
// map a row index r to the element offset of the row's first element:
//   r = i0 + size0 * (i1 + size1 * (i2 + ...)),  offset = sum_g i_g * stride[g].
// The outermost group takes whatever is left of r, so it needs no size.
// A stride of 0 reads one row for the whole group (a broadcast mask).
constexpr int kMaxRowGroups = 4;
struct RowIndex {
  long long stride[kMaxRowGroups];
  FastDiv size[kMaxRowGroups - 1];
  int groups;  // 1 .. kMaxRowGroups
  int pad_;
};

// What the forward kernel masks out.
enum SoftmaxKind : int {
  kSoftmaxPlain = 0,   // nothing
  kSoftmaxMasked = 1,  // elements whose mask byte is nonzero
  kSoftmaxCausal = 2,  // keys j > q + diag, for the row's query index q
};

// Kernel options (the OPTS template argument; the planner sets them):
// - kSoftmaxKeepExp: a cached row keeps exp2(z - m) in fp32 registers for
//   the write pass instead of recomputing it.
// - kSoftmaxHeadsInner (masked forward only): rows are taken in an order
//   where the rows that share one mask row (a broadcast dim, e.g. heads) are
//   consecutive, so a mask row is read from DRAM once and then hits L2.
// - kSoftmaxMaskReuse (with kSoftmaxHeadsInner, cached rows only): each row
//   group loads its mask row's bits once and applies them to a run of the
//   rows sharing it (reuse_splits runs per mask row), so the mask is read
//   from L2 and unpacked once per run rather than once per row.
// - kSoftmaxStreamStore: the output (y or dx) is stored evict-first (.cs):
//   nothing in the kernel reads it again.
// - kSoftmaxL1Alloc: x (or y and dy) load through L1 (allocating) rather
//   than around it.
// - kSoftmaxClusterBits (cached rows of one CTA each, sm_90+): log2 of the
//   CTAs of a thread-block cluster that split every row between them; their
//   row statistics meet in distributed shared memory (common/cluster.cuh).
enum SoftmaxOpt : unsigned {
  kSoftmaxKeepExp = 1u,
  // 2u: unused (a prefetching persistent grid lost 4-35%, history entry 89)
  kSoftmaxHeadsInner = 4u,
  kSoftmaxMaskReuse = 8u,
  kSoftmaxStreamStore = 16u,
  kSoftmaxL1Alloc = 32u,
  kSoftmaxClusterBits = 3u << 6,
};
constexpr int kSoftmaxClusterShift = 6;

struct SoftmaxFwdParams {
  const void* x;
  RowIndex x_rows;
  const unsigned char* mask;  // kSoftmaxMasked: bool bytes, rows per mask_rows
  RowIndex mask_rows;
  void* y;           // contiguous rows x cols
  FastDiv sq;        // kSoftmaxCausal: rows per (sq x sk) matrix; q = row % sq
  int rows;          // < 2^31
  int row_blocks;    // ceil(rows / rows per CTA)
  int cols;          // sk: elements per row, a multiple of the kernel's VEC
  int diag;          // kSoftmaxCausal: sk - sq (>= 0)
  float scale_log2;  // scale * log2(e): exp(scale * x) == exp2(scale_log2 * x)
  // kSoftmaxMaskReuse: runs each mask row's bcast rows are split into (1 ..
  // bcast); row block rb is run rb % reuse_splits of mask row block
  // rb / reuse_splits, and row_blocks = mask row blocks x reuse_splits.
  int reuse_splits;
  // kSoftmaxHeadsInner: rows = outer x bcast x inner, the mask constant along
  // bcast; step i takes row ((i / bcast) / inner * bcast + i % bcast) * inner
  // + (i / bcast) % inner.
  FastDiv inner;
  FastDiv bcast;
};

struct SoftmaxBwdParams {
  const void* y;  // the forward's output: contiguous rows x cols
  const void* dy;
  RowIndex dy_rows;
  void* dx;  // contiguous rows x cols
  FastDiv sq;
  int rows;
  int row_blocks;
  int cols;
  int diag;  // causal: keys j > q + diag have y == 0 and get dx == 0 unread
  float scale;
  int pad_;
};

}  // namespace rtcnorm
