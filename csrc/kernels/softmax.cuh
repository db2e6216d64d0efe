// Fused scaled (masked / causal) softmax over the last dim, forward and
// backward:
//   y  = softmax(scale * x), masked elements excluded (y = 0 there)
//   dx = scale * y * (dy - sum(dy * y))
//
// Thread layout: a CTA of TPR * ROWS threads holds ROWS row groups; group g
// owns row rb * ROWS + g of row block rb. Thread `lane` of a group owns the
// VEC-wide vectors lane, lane + TPR, ... of its row, NV of them per chunk of
// TPR * NV vectors. With a cluster of CL CTAs (kSoftmaxClusterBits, cached
// rows only, ROWS == 1), a row block belongs to a cluster and CTA `rank` of
// it owns vectors (i * CL + rank) * TPR + lane, i < NV: each CTA holds
// interleaved TPR-vector pieces of the row, so a causal prefix spreads over
// the whole cluster, and the row's statistics meet through distributed
// shared memory (common/cluster.cuh).
//
// The row length `cols` is a run-time value: a kernel serves every row
// length up to its capacity (CACHED: TPR * NV * VEC elements; streamed: any),
// so a decode loop whose key length grows by one per step reuses a handful
// of kernels instead of compiling one per length. Register arrays are still
// sized and unrolled at compile time by NV.
//
// Invariants (the host's planner guarantees them; see ops/softmax_plan.cpp):
// - cols % VEC == 0; x, dy and the mask are VEC-aligned at every row start
//   (the mask in bytes); y, dx are contiguous rows x cols.
// - CACHED: the row is one chunk (cols / VEC <= CL * TPR * NV); it is read once
//   into registers as raw T. Otherwise ROWS == 1 and the row is streamed:
//   one online (max, sum) pass, then a second pass, in reverse chunk order
//   so its first reads are the chunks the first pass touched last (most
//   likely still in L2).
// - The row-block loop is uniform across the CTA (rows past the end still
//   take part in the barriers of group_allreduce).
// - MINB is the launch-bounds minimum of resident CTAs per SM: registers are
//   capped at 65536 / (MINB * TPR * ROWS) per thread. OPTS holds SoftmaxOpt
//   bits; kSoftmaxKeepExp acts on cached rows only.
// - Causal rows never read past their last visible key: vectors wholly
//   beyond it are neither loaded nor computed, only written as zeros; the
//   one straddling it is loaded and its masked lanes set to -inf. The
//   backward likewise reads neither y nor dy there.
#pragma once

#pragma once

#include "softmax/bwd.cuh"
#include "softmax/flat.cuh"
#include "softmax/fwd.cuh"
