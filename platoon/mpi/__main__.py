"""``python -m platoon.mpi``: one node of a multi-node job (see platoon.mpi)."""

import sys

from platoon.mpi import main

sys.exit(main())
