"""`python -m moonvit_kernels.tools.gpu_check --out DIR` (short: `python -m moonvit_kernels.gpu_check`); see the
package docstring."""

import sys

from moonvit_kernels.tools.gpu_check.run import main

sys.exit(main())
