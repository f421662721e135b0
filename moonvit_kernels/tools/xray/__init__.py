"""Kernel X-ray: what decides a kernel's speed, measured without a GPU ("model, no GPU").

    python -m moonvit_kernels.tools.xray [KERNEL ...] [--arch sm_80,sm_89,sm_90] [--out DIR]

Five views per kernel instantiation, one module each:
  build / cubin   resources of the real compiled binary (registers, shared memory, stack, spills)
  occupancy       resident blocks and warps per SM per architecture, and the limiting resource (arch)
  sass            instruction mix of the kernel and of its innermost loops; instructions per FMA
  trace/counters  bank conflicts and coalescing of every access site, by running the kernel on the
                  CPU (numba simulator; CUDA C emulator) and costing each warp's addresses
  roofline        lower-bound time at K3 shapes from every roof: compute per instruction class (FFMA,
                  mma.sync, wgmma), DRAM, shared-memory wavefronts and instruction issue, the last two
                  from the SASS of the FMA loops scaled to the launch (launch_counts)
`report` puts them together (Markdown, xray.csv, PNGs); `calibration` sets gpu_check's measured
rates beside the bounds once a GPU run exists, and says so while none does.
"""
