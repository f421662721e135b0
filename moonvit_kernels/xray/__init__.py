"""Kernel X-ray: what decides a kernel's speed, measured without a GPU ("model, no GPU").

    python -m moonvit_kernels.xray [KERNEL ...] [--arch sm_80,sm_89,sm_90] [--out DIR]

Five views per kernel instantiation, one module each:
  build / cubin   resources of the real compiled binary (registers, shared memory, stack, spills)
  occupancy       resident blocks and warps per SM per architecture, and the limiting resource (arch)
  sass            instruction mix of the kernel and of its innermost loops; instructions per FMA
  trace/counters  bank conflicts and coalescing of every access site, by running the kernel on the
                  CPU (numba simulator; CUDA C emulator) and costing each warp's addresses
  roofline        FLOPs and bytes at K3 shapes, lower-bound time from datasheet peaks
`report` puts them together (Markdown, xray.csv, PNGs).
"""
