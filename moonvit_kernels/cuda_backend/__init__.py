"""The CUDA C backend: one `.cu` file per stage (plus the Hopper sm_90a rung), their catalogue
(`sources`), the CuPy launchers (`launchers`, `hopper_launchers`), `CupyBackend` (`backend`), the
compile tier (`nvrtc_check`) and the CPU emulator, a device the same launchers run on (`emulation`).

Nothing is imported here: `import moonvit_kernels.cuda_backend` needs neither CuPy nor a compiler."""
