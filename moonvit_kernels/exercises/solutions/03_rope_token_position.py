"""Solution of exercise "rope_token_position" (notebook 03): a token's (row, col) in a packed batch."""

from moonvit_kernels.numba_backend._cuda import cuda


@cuda.jit
def rope_token_position(grid_thws, cu_seqlens, n_items, pos, L):
    l = cuda.grid(1)
    if l >= L:
        return
    item = 0
    for n in range(n_items):
        if cu_seqlens[n] <= l and l < cu_seqlens[n + 1]:
            item = n
    h = grid_thws[item, 1]
    w = grid_thws[item, 2]
    p = (l - cu_seqlens[item]) % (h * w)  # every frame of a video restarts at (0, 0)
    pos[l, 0] = p // w
    pos[l, 1] = p % w
