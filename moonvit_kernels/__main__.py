"""`python -m moonvit_kernels …` — see moonvit_kernels.cli."""

import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line's modules load
    print("interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
