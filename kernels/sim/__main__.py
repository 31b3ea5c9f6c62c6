import sys

from toolcall.kernels.sim.cli import main

sys.exit(main())
