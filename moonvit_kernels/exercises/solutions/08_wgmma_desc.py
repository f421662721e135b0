"""Solution of exercise "wgmma_desc" (notebook 08): wgmma's matrix descriptor as four 16-bit words."""

from moonvit_kernels.numba_backend._cuda import cuda


@cuda.jit
def wgmma_desc(params, out):
    i = cuda.grid(1)  # one thread per descriptor
    if i >= params.shape[0]:
        return
    addr, lbo, sbo, mode = params[i, 0], params[i, 1], params[i, 2], params[i, 3]
    out[i, 0] = (addr & 0x3FFFF) >> 4  # bits 0..13: start address in 16-byte units (18-bit shared addresses)
    out[i, 1] = (lbo >> 4) & 0x3FFF  # bits 16..29: leading-dimension byte offset >> 4
    out[i, 2] = (sbo >> 4) & 0x3FFF  # bits 32..45: stride-dimension byte offset >> 4
    out[i, 3] = mode << 14  # bits 62..63: swizzle mode (base offset, bits 49..51, stays 0)
