// Programmatic dependent launch (sm_90+): a kernel launched with the
// programmatic-serialization attribute (jit::launch's `programmatic`) may have
// its CTAs scheduled while the previous kernel of the stream still runs.
//
// Invariants:
// - A programmatically launched kernel calls grid_dependency_wait() before it
//   reads or writes any memory the previous kernel touches. The wait returns
//   once that kernel has completed and its writes are visible, so results are
//   those of a plain stream-ordered launch.
// - allow_dependents() only lets the next kernel's CTAs be scheduled (they
//   still block in their wait); it is safe anywhere, and a kernel that never
//   calls it triggers when it exits.
// - Before sm_90 both are no-ops, and the host never sets the attribute there.
#pragma once

namespace rtcnorm {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace rtcnorm
