"""The device's quantization arithmetic equals the host's, float by float.

The norm kernels and the CPU implementation share kernels/common/quant_math.cuh,
and the NVFP4 epilogue swaps in hardware FP8 conversions from sm_89 on
(kernels/norm/quant_epilogue.cuh). A small kernel, compiled by NVRTC from the
same headers and launched through the CUDA driver, compares over every fp32
bit pattern:

- e2m1_code against the plain definition (the code of the nearest E2M1 value,
  ties to the even code, saturating; NaN gives +6) and e2m1_codes' packing
  of products (the device clamps magnitudes only and gathers signs with byte
  permutes);
- on sm_89+, the hardware E4M3 byte and value against quant::e4m3_code and
  e4m3_value for every non-negative float and +inf (the block-scale inputs),
  and the epilogue's (scale byte, encode multiplier from the CTA's table)
  against quant::nvfp4_scale_code / nvfp4_encode for every non-negative
  block amax;
  the words of four FP8 data codes (E4M3 and E5M2) against
  quant::e4m3_code / e5m2_code for every float (NaN as arithmetic gives it).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import rtcnorm
import torch

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).resolve().parents[1] / "csrc" / "kernels"
SOURCE = r"""
#include "norm/quant_epilogue.cuh"
using namespace rtcnorm;

// E2M1 from its definition: the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 by
// comparisons with the midpoints, ties to the even code; NaN gives +6.
__device__ unsigned e2m1_by_compares(float v) {
  const float a = fabsf(v);
  if (a != a) return 7u;
  const unsigned mag = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.f);
  return (__float_as_uint(v) >> 31) << 3 | mag;
}

// bad[0]: e2m1_code; bad[1]: e2m1_codes<8> and <4>; bad[2]: hardware E4M3 byte;
// bad[3]: hardware E4M3 value; bad[4]: NVFP4 scale byte and multiplier;
// bad[5]: hardware FP8 data words.
extern "C" __global__ void check(unsigned long long* bad, float gs) {
#if __CUDA_ARCH__ >= 890
  nvfp4_fill_encode_table(gs);
#endif
  const unsigned long long stride = 1ull * gridDim.x * blockDim.x;
  for (unsigned long long i = 1ull * blockIdx.x * blockDim.x + threadIdx.x; i < (1ull << 32); i += stride) {
    const unsigned u = static_cast<unsigned>(i);
    const float v = __uint_as_float(u);
    if (quant::e2m1_code(v) != e2m1_by_compares(v)) atomicAdd(&bad[0], 1ull);
    if ((u & 7u) == 0) {  // eight patterns spread over the range, multiplier 1
      // Products: a NaN is the canonical 0x7FFFFFFF, as the epilogue's are.
      float w[8];
      unsigned want = 0;
      for (int j = 0; j < 8; ++j) {
        const unsigned b = u + 0x2f0e3d1bu * j;
        w[j] = __uint_as_float((b & 0x7fffffffu) > 0x7f800000u ? 0x7fffffffu : b);
        want |= quant::e2m1_code(w[j]) << (4 * j);
      }
      const float w4[4] = {w[0], w[1], w[2], w[3]};
      if (quant::e2m1_codes<8>(w, 1.f) != want || quant::e2m1_codes<4>(w4, 1.f) != (want & 0xffffu))
        atomicAdd(&bad[1], 1ull);
    }
#if __CUDA_ARCH__ >= 890
    if ((u & 3u) == 0) {  // four consecutive patterns, both FP8 formats
      // The epilogue converts products, whose NaN is the canonical 0x7FFFFFFF.
      float q[4];
      unsigned e4 = 0, e5 = 0;
      for (int j = 0; j < 4; ++j) {
        const unsigned b = u + j;
        q[j] = __uint_as_float((b & 0x7fffffffu) > 0x7f800000u ? 0x7fffffffu : b);
        e4 |= quant::e4m3_code(q[j]) << (8 * j);
        e5 |= quant::e5m2_code(q[j]) << (8 * j);
      }
      if (fp8x4<false>(q[0], q[1], q[2], q[3]) != e4 || fp8x4<true>(q[0], q[1], q[2], q[3]) != e5)
        atomicAdd(&bad[5], 1ull);
    }
    if (u <= 0x7f800000u) {  // non-negative, up to +inf
      const unsigned c = e4m3_of(v);
      if (c != quant::e4m3_code(v)) atomicAdd(&bad[2], 1ull);
      if (__float_as_uint(e4m3_decode(c)) != __float_as_uint(quant::e4m3_value(c))) atomicAdd(&bad[3], 1ull);
      const unsigned code = nvfp4_block_code(v, gs);
      const float enc = nvfp4_encode_table()[code];
      if (code != quant::nvfp4_scale_code(v, gs) || __float_as_uint(enc) != __float_as_uint(quant::nvfp4_encode(code, gs)))
        atomicAdd(&bad[4], 1ull);
    }
#endif
  }
}
"""
CHECKS = (
    "e2m1_code",
    "e2m1_codes",
    "hardware E4M3 byte",
    "hardware E4M3 value",
    "NVFP4 scale and multiplier",
    "hardware FP8 words",
)


def _call(fn, *args):
    r = fn(*args)
    assert r == 0, f"{fn.__name__} failed with {r}"


def _compile(arch: int) -> bytes:
    """SOURCE compiled for sm_<arch>: a cubin where NVRTC knows the arch, else PTX for the driver."""
    info = rtcnorm.jit.nvrtc_info()
    nvrtc = ctypes.CDLL(info["path"])
    known = arch in info["archs"]
    target = f"sm_{arch}" if known else f"compute_{max(a for a in info['archs'] if a < arch)}"
    prog = ctypes.c_void_p()
    _call(nvrtc.nvrtcCreateProgram, ctypes.byref(prog), SOURCE.encode(), b"check.cu", 0, None, None)
    opts = [f"--gpu-architecture={target}", "-std=c++17", f"-I{KERNELS}"]
    copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    if nvrtc.nvrtcCompileProgram(prog, len(opts), copts) != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        pytest.fail(f"NVRTC could not compile the check kernel for {target}:\n{log.value.decode()}")
    get_size, get = (
        (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if known else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
    )
    size = ctypes.c_size_t()
    _call(get_size, prog, ctypes.byref(size))
    image = ctypes.create_string_buffer(size.value)
    _call(get, prog, image)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return image.raw


@pytest.mark.parametrize("gs", [448.0 * 6.0 / 3.7, 1.0, 2.0**-100, 3.0e38])
def test_device_quant_math_equals_host_for_every_float(gs):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    major, minor = torch.cuda.get_device_capability()
    bad = torch.zeros(len(CHECKS), dtype=torch.int64, device="cuda")  # makes torch's context current
    image = _compile(major * 10 + minor)
    cuda = ctypes.CDLL("libcuda.so.1")
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    _call(cuda.cuModuleLoadData, ctypes.byref(module), ctypes.c_char_p(image))
    try:
        _call(cuda.cuModuleGetFunction, ctypes.byref(fn), module, b"check")
        ptr, scale = ctypes.c_uint64(bad.data_ptr()), ctypes.c_float(gs)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(scale))
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        _call(cuda.cuLaunchKernel, fn, sms * 8, 1, 1, 256, 1, 1, 0, stream, params, None)
        counts = bad.cpu().tolist()
    finally:
        cuda.cuModuleUnload(module)
    checked = CHECKS if major * 10 + minor >= 89 else CHECKS[:2]
    assert counts == [0] * len(CHECKS), dict(zip(checked, counts))
