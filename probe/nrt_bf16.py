"""Temporary GPU probe (deleted after use): NRT under LTO, bf16 NVRTC includes."""
import pickle
import traceback

import numpy as np
from numba import cuda
from numba.cuda import config

import daskgpu as dg
from daskgpu._compiler.links import _include_dirs


def copy_kernel(x, out):
    y = x.copy()
    out[0] = y[1]


def main():
    from cuda.bindings import nvrtc
    print("nvrtc", nvrtc.nvrtcVersion(), "includes", _include_dirs())
    config.CUDA_ENABLE_NRT = True
    for lto in (False, True):
        try:
            k = dg.jit("void(float32[::1], float32[::1])", lto=lto)(copy_kernel)
            print("NRT lto", lto, [(l.name, l.kind) for l in k.images[0].links])
            k = pickle.loads(pickle.dumps(k))
            out = k[1, 1](np.arange(4, dtype=np.float32), np.zeros(1, np.float32))
            print("NRT lto", lto, "OK", out)
        except Exception as e:
            print("NRT lto", lto, "FAIL", str(e)[:1200])
    config.CUDA_ENABLE_NRT = False
    from numba.cuda.bf16 import bfloat16

    def kb():
        bfloat16(3.14)
    try:
        k = dg.kernel(cuda.jit(kb), signatures=[])
        k.compile(())
        print("bf16 links", [(l.name, l.kind) for l in k.images[0].links])
        pickle.loads(pickle.dumps(k))[1, 1]()
        print("bf16 OK")
    except Exception:
        print("bf16 FAIL", traceback.format_exc()[-3000:])


if __name__ == "__main__":
    main()
