"""Time the NumPy reference `vision_forward` at the real K3 dimensions against PyTorch on the CPU.

    PYTHONPATH=. python benchmarks/bench_reference.py [--layers 4] [--side 448] [--repeats 7] [--csv FILE]

A thin wrapper: the benchmark lives in `moonvit_kernels.tools.gpu_check.cpu_reference` (alternating
NumPy / torch runs, median per-round ratio, tracemalloc peak) and the torch tower in
`moonvit_kernels.tools.gpu_check.torch_tower` (also gpu_check's bf16 GPU baseline).
"""

from moonvit_kernels.tools.gpu_check.cpu_reference import main

if __name__ == "__main__":
    main()
