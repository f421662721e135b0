"""`python -m moonvit_kernels.gpu_check --out DIR`: see the package docstring."""

import sys

from .run import main

sys.exit(main())
