"""A worker whose controller never answers: it logs (WARNING and up) to stdout while it waits.

usage: lonely_worker.py PORT TIMEOUT_S
"""

import logging
import sys

from platoon import Worker

logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                    format="%(levelname)s %(name)s: %(message)s")
Worker(control_port=int(sys.argv[1]), timeout_s=float(sys.argv[2]))
