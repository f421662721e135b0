"""numba.cuda kernels of the vision tower, one module per stage (`gemm`, `rmsnorm`, `pos_emb`, `rope`, `merge`,
`attention`), plus `launch` (shared launcher checks). Submodules are imported on demand, so that importing the
package never initialises numba or CUDA."""
