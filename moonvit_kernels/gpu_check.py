"""`python -m moonvit_kernels.gpu_check`: the short name of `python -m moonvit_kernels.tools.gpu_check`
(the one command a GPU session runs; the tool itself lives in `moonvit_kernels/tools/gpu_check/`)."""

import sys

if __name__ == "__main__":
    from moonvit_kernels.tools.gpu_check.run import main

    sys.exit(main())
