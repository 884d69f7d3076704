#!/usr/bin/env python3
"""tanh_error.py — the error of a GPU's fp32 tanh, measured exhaustively (every fp32 input).

FlashAttention-4 computes softcap as softcap * tanh(s / softcap) with
`cute.math.tanh(..., fastmath=True)` (flash_attn/cute/utils.py, create_softcap_scoremod), which
the CuTe DSL lowers to the PTX instruction `tanh.approx.f32` (compile a kernel calling it with
CUTE_DSL_KEEP=ptx and read the .ptx: tools/device/tanh_error.py --ptx shows how). PTX ISA,
"Floating Point Instructions: tanh", documents it as an approximation without a correctly
rounded result. attest's lse bound for a kernel that declares it (docs/protocol.md,
"softcap_tanh") is built from the table this script prints: for every binade of |x| (x the
fp32 argument), the largest |tanh~(x) - tanh(x)| over all 2^23 inputs of that binade, both
signs, against CUDA's double tanh (about 1 ulp of a double: 2^-52 relative, far below what is
measured). The same is done for the correctly rounded-ish `tanhf` (CUDA Math API: 2 ulps) as a
control.

Runs on a CUDA host with CuPy: python3 tools/device/tanh_error.py > table.json
"""
import json
import sys

KERNEL = r"""
extern "C" __global__ void measure(unsigned int first_chunk, unsigned long long* abs_err,
                                   unsigned long long* rel_err, unsigned int* worst_x,
                                   int approx) {
  // One block: 65536 consecutive bit patterns (inside one binade and one sign).
  const unsigned int chunk = first_chunk + blockIdx.x;
  const unsigned int base = chunk << 16;
  double amax = 0, rmax = 0;
  unsigned int xmax = base;
  for (unsigned int t = threadIdx.x; t < 65536u; t += blockDim.x) {
    const unsigned int bits = base + t;
    const float x = __uint_as_float(bits);
    if (!isfinite(x)) continue;
    float y;
    if (approx) {
      asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    } else {
      y = tanhf(x);
    }
    const double r = tanh((double)x);
    const double a = fabs((double)y - r);
    if (a > amax) { amax = a; xmax = bits; }
    if (r != 0) rmax = fmax(rmax, a / fabs(r));
  }
  // Per-thread maxima to the bucket (sign and exponent field of x: bits >> 23).
  const unsigned int bucket = base >> 23;
  const unsigned long long ab = __double_as_longlong(amax);
  const unsigned long long old = atomicMax(&abs_err[bucket], ab);
  if (ab > old) atomicExch(&worst_x[bucket], xmax);  // racy tie-break: any worst input is fine
  atomicMax(&rel_err[bucket], (unsigned long long)__double_as_longlong(rmax));
}
"""


def ptx_of_cute_tanh():
    """The PTX the CuTe DSL emits for cute.math.tanh(x, fastmath=True) (needs nvidia-cutlass-dsl)."""
    import os
    import tempfile
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ["CUTE_DSL_KEEP"] = "ptx"
    d = tempfile.mkdtemp()
    os.environ["CUTE_DSL_DUMP_DIR"] = d
    import cutlass.cute as cute
    import cutlass.cute.runtime as rt
    import numpy as np

    @cute.kernel
    def k(x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        y[tidx] = cute.math.tanh(x[tidx], fastmath=True)

    @cute.jit
    def launch(x: cute.Tensor, y: cute.Tensor):
        k(x, y).launch(grid=[1, 1, 1], block=[32, 1, 1])

    a = np.zeros(32, np.float32)
    cute.compile(launch, rt.from_dlpack(a), rt.from_dlpack(a.copy()))
    lines = []
    for name in os.listdir(d):
        with open(os.path.join(d, name)) as f:
            lines += [l.strip() for l in f if "tanh" in l and not l.strip().startswith("//")]
    return lines


def measure(approx):
    import cupy as cp
    fn = cp.RawKernel(KERNEL, "measure")
    abs_err = cp.zeros(512, dtype=cp.uint64)
    rel_err = cp.zeros(512, dtype=cp.uint64)
    worst = cp.zeros(512, dtype=cp.uint32)
    chunks = 1 << 16  # 2^32 patterns in chunks of 2^16
    step = 4096
    for first in range(0, chunks, step):
        fn((step,), (256,), (cp.uint32(first), abs_err, rel_err, worst, cp.int32(approx)))
    cp.cuda.runtime.deviceSynchronize()
    a = abs_err.get().view("float64")
    r = rel_err.get().view("float64")
    w = worst.get().view("float32")
    rows = []
    for e in range(255):  # exponent field 0..254 (255: inf, nan)
        pos, neg = e, 256 + e
        rows.append({"exponent_field": e,
                     "max_abs_error": float(max(a[pos], a[neg])),
                     "max_rel_error": float(max(r[pos], r[neg])),
                     "worst_x": float(w[pos] if a[pos] >= a[neg] else w[neg]),
                     "asymmetric": bool(a[pos] != a[neg])})
    return rows


def main():
    if "--ptx" in sys.argv:
        print("\n".join(ptx_of_cute_tanh()))
        return
    import cupy as cp
    dev = cp.cuda.runtime.getDeviceProperties(0)
    out = {"device": dev["name"].decode(), "compute_capability": f"{dev['major']}.{dev['minor']}",
           "inputs": "every finite fp32 x, both signs; error against CUDA's double tanh",
           "tanh.approx.f32": measure(1), "tanhf": measure(0)}
    for name in ("tanh.approx.f32", "tanhf"):
        rows = out[name]
        out[name + " summary"] = {"max_abs_error": max(r["max_abs_error"] for r in rows),
                                  "max_rel_error": max(r["max_rel_error"] for r in rows)}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
