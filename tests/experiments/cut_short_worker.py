"""Sends itself SIGTERM (as the launcher stops a job) inside an import-like step that turns the
handler's SystemExit into ImportError, as an extension module's import does when a signal cuts
it short (numpy: "PyCapsule_Import could not import module ..."); never gets further."""

import os
import signal
import time

try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except SystemExit as exc:
    raise ImportError('PyCapsule_Import could not import module "datetime"') from exc
print("NOT STOPPED", flush=True)
