"""A new secret for a job: random text in a file only its user can read, made by whoever starts
the job (``platoon-launcher --elastic``, ``python -m platoon.elastic.lighthouse --new-secret``)
and read by its processes (`platoon.elastic.secret.load_secret`)."""

import os
import secrets


def generate_secret(path: str) -> str:
    """Write a new random secret to `path` (created 0600, never overwritten: FileExistsError);
    returns the path. Copy the file to every node and to the lighthouse's host."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return path
