"""Checkpoints of the centre: written atomically, read without unpickling anything."""

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import struct
import threading
import zipfile
import zlib
from typing import Dict, Set, Union

import numpy as np

from .._os.process import pid_alive
from ..errors import CheckpointError
from ..protocol import check_names

log = logging.getLogger(__name__)

# What reading a damaged file can raise, from the zip layer, zlib and numpy's format.
_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error,
                struct.error, NotImplementedError, RuntimeError)
_DEFLATE_MAX_RATIO = 1032  # deflate expands a byte to at most this many: a claim beyond is false
_CHUNK = 1 << 20  # elements checked for NaN/Inf at a time (bounded scratch memory)
_WRITING: Set[str] = set()  # temporaries this process is writing now
_WRITING_LOCK = threading.Lock()


def save(path, arrays, meta=None, states=None, *, job_id=None, resumed_job_id=None,
         dir_fd=None):
    """Write `arrays` (and JSON `meta`) to `path` atomically: a crash mid-write leaves the
    previous checkpoint intact. The file is 0600 whatever the umask. `states`
    ({name: [arrays]}, a Downpour optimizer's) is saved alongside and read back by
    `load_states`. With `job_id`, the temporary file is named after the job, and the
    temporaries of `path` that writers of this job (or of `resumed_job_id`, the job it
    resumed from) left when killed mid-write are removed first; never another job's, nor
    one being written. With `dir_fd` (the directory of `path`, opened by the launcher), the
    file is written in that directory by name, whatever `path`'s directories lead to now.
    Never through a link. Raises OSError if it cannot be written."""
    directory, name = os.path.split(os.path.abspath(path))
    if dir_fd is None:
        os.makedirs(directory, exist_ok=True)
        where = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        where = os.dup(dir_fd)
    try:
        _save_in(where, directory, name, arrays, meta, states, job_id, resumed_job_id)
        os.fsync(where)  # the rename is durable
    finally:
        os.close(where)


def _save_in(dir_fd, directory, name, arrays, meta, states, job_id, resumed_job_id):
    """`save` into file `name` of directory `dir_fd` (`directory`, in messages)."""
    # Unique per call: a periodic checkpoint may run beside an explicit one.
    if job_id is None:
        tmp = "%s.%d.%s.tmp" % (name, os.getpid(), secrets.token_hex(4))
    else:
        for ours in {job_id, resumed_job_id} - {None}:
            _remove_stale_temporaries(dir_fd, directory, name, _job_tag(ours))
        tmp = "%s.%s.%d.%s.tmp" % (name, _job_tag(job_id), os.getpid(), secrets.token_hex(4))
    payload = {"param_%d" % i: a for i, a in enumerate(arrays)}
    for state_name, state in (states or {}).items():
        payload.update(("state_%d_%s" % (i, state_name), a) for i, a in enumerate(state))
    payload["meta"] = np.frombuffer(json.dumps(meta or {}).encode(), dtype=np.uint8)
    created = False
    shown = os.path.join(directory, tmp)
    with _WRITING_LOCK:
        _WRITING.add(shown)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600, dir_fd=dir_fd)
        created = True
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # exactly 0600, whatever the umask removed
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        created = False
    finally:
        if created:
            os.unlink(tmp, dir_fd=dir_fd)
        with _WRITING_LOCK:
            _WRITING.discard(shown)


def _job_tag(job_id):
    """`job_id` as it appears in the names of the job's temporaries: itself when it is a
    plain word, else a digest of it."""
    if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", job_id):
        return job_id
    return hashlib.sha256(job_id.encode()).hexdigest()[:16]


def _remove_stale_temporaries(dir_fd, directory, base, tag):
    """Unlink the temporaries of checkpoint `base` in directory `dir_fd` (`directory`, in
    messages) whose writer, of the job tagged `tag`, was killed mid-write (its process is
    gone; they are never replaced). Those of other jobs, of live processes, and this
    process's own in flight are left alone."""
    ours = re.compile(re.escape("%s.%s." % (base, tag)) + r"(\d+)\.[0-9a-f]+\.tmp")
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for name in names:
        match = ours.fullmatch(name)
        if match is None:
            continue
        stale = os.path.join(directory, name)
        pid = int(match.group(1))
        with _WRITING_LOCK:
            if stale in _WRITING or (pid != os.getpid() and pid_alive(pid)):
                continue
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue  # removed meanwhile
        log.warning("removed %s, a checkpoint temporary that a killed writer (pid %d) of "
                    "this job left", stale, pid)


def _resolve(path):
    return os.path.join(path, "centre.npz") if os.path.isdir(path) else path


def _unreadable(path, exc, what="checkpoint"):
    return CheckpointError(
        "cannot read %s %s (%s: %s); pass the directory or .npz file that a controller wrote "
        "with checkpoint_path, or an earlier copy if this one is damaged"
        % (what, path, type(exc).__name__, exc))


@contextlib.contextmanager
def _open(path):
    """The .npz archive at `path`, open (numpy's NpzFile), with its entries' shapes by name,
    once every entry's header has been checked against the file's size: nothing is
    allocated for what a damaged or forged file merely claims to hold."""
    with open(path, "rb") as f:
        head = f.read(len(np.lib.format.MAGIC_PREFIX))
        if not head:
            raise EOFError("the file is empty")
        if head == np.lib.format.MAGIC_PREFIX:
            raise ValueError("a single array, not an .npz archive of a controller's checkpoint")
        if not head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
            raise ValueError("not an .npz archive (no zip signature at its start)")
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        with zipfile.ZipFile(f) as archive:
            shapes = {info.filename[:-len(".npy")]: _check_entry(archive, info, size)
                      for info in archive.infolist()}
        f.seek(0)
        with np.load(f, allow_pickle=False) as data:
            yield data, shapes


def _check_entry(archive, info, size):
    """The shape of zip entry `info` of `archive` (a file of `size` bytes). Raise ValueError
    unless it is an .npy array whose header's shape and dtype need exactly the bytes the
    entry holds, and whose bytes fit in the file (stored) or in what deflate can expand
    it to."""
    name = info.filename
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError("entry %s is compressed with zip method %d; a checkpoint's entries "
                         "are stored or deflated (np.savez, np.savez_compressed)"
                         % (name, info.compress_type))
    if info.compress_size > size or (info.compress_type == zipfile.ZIP_STORED
                                     and info.file_size != info.compress_size) \
            or info.file_size > _DEFLATE_MAX_RATIO * info.compress_size + 1024:
        raise ValueError("entry %s claims %d bytes (%d in the file), more than the file's %d "
                         "bytes can hold" % (name, info.file_size, info.compress_size, size))
    if not name.endswith(".npy"):
        raise ValueError("entry %s is not an .npy array" % name)
    with archive.open(info) as entry:
        version = np.lib.format.read_magic(entry)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
            else np.lib.format.read_array_header_2_0  # 3.0 differs only in its text encoding
        shape, _, dtype = read_header(entry)
        header_bytes = entry.tell()
    if dtype.hasobject:
        raise ValueError("entry %s holds Python objects (%s), which a checkpoint never does"
                         % (name, dtype))
    if any(n < 0 for n in shape):
        raise ValueError("entry %s has a negative dimension in its shape %s" % (name, shape))
    needed = math.prod(shape) * dtype.itemsize  # Python integers: no overflow
    held = info.file_size - header_bytes
    if needed != held:
        raise ValueError("entry %s claims shape %s of %s (%d bytes) but holds %d bytes of data"
                         % (name, shape, dtype, needed, held))
    return shape


def load(path, *, allow_nonfinite=False):
    """(arrays, meta) from checkpoint `path` (an .npz file, or a directory holding
    centre.npz).

    Raises CheckpointError naming the file when it is missing, truncated or corrupt,
    holds no parameters, or (unless `allow_nonfinite`) holds NaN or Inf.
    """
    path = _resolve(path)
    try:
        with _open(path) as (data, _):
            count = sum(1 for name in data.files if name.startswith("param_"))
            if count == 0:
                raise KeyError("no param_0 entry: it holds no parameters")
            arrays = [data["param_%d" % i] for i in range(count)]
            meta = json.loads(bytes(data["meta"]).decode()) if "meta" in data.files else {}
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None
    if not allow_nonfinite:
        _refuse_nonfinite(path, arrays, lambda index: "parameter %d" % index, "load")
    return arrays, meta


def _refuse_nonfinite(path, arrays, naming, loader):
    """CheckpointError for the first of `arrays` (of checkpoint `path`, `naming(index)` saying
    which) that holds NaN or Inf; `loader`: the checkpoint function that takes allow_nonfinite."""
    for index, array in enumerate(arrays):
        bad = _count_nonfinite(array)
        if bad:
            raise CheckpointError(
                "checkpoint %s: %s (shape %s, %s) holds %d NaN or Inf value(s), so the run that "
                "wrote it had diverged; resume from an earlier checkpoint, or pass "
                "allow_nonfinite=True (to Controller or checkpoint.%s) to use it anyway"
                % (path, naming(index), array.shape, array.dtype, bad, loader))


def _count_nonfinite(array):
    if array.dtype.kind not in "fc":
        return 0
    flat = array.ravel(order="K")  # a view, whatever the memory order
    bad = 0
    for start in range(0, flat.size, _CHUNK):
        chunk = flat[start:start + _CHUNK]
        bad += int(chunk.size - np.count_nonzero(np.isfinite(chunk)))
    return bad


def names_in(meta, count, path):
    """The parameter names a checkpoint's `meta` holds (None in a checkpoint written
    without names); CheckpointError naming `path` if they are unusable."""
    names = meta.get("names") if isinstance(meta, dict) else None
    if names is None:
        return None
    try:
        return check_names(names, count)
    except (TypeError, ValueError) as exc:
        raise CheckpointError("checkpoint %s: its parameter names are unusable (%s); pass an "
                              "earlier copy" % (path, exc)) from None


def load_centre(path: Union[str, "os.PathLike[str]"], *,
                allow_nonfinite: bool = False) -> Dict[str, np.ndarray]:
    """The centre saved in checkpoint `path` (an .npz file, or a directory holding
    centre.npz, such as a launcher's log directory) as {name: array}, in the centre's order.

    The names are those given to `Worker.init_shared_params(names=...)` (`PeriodicSync`
    gives the model's state-dict keys), else param_0, param_1, ... Raises CheckpointError
    as `load` does.
    """
    arrays, meta = load(path, allow_nonfinite=allow_nonfinite)
    names = names_in(meta, len(arrays), _resolve(path))
    if names is None:
        names = ["param_%d" % i for i in range(len(arrays))]
    return dict(zip(names, arrays))


def load_states(path, *, allow_nonfinite=False):
    """{name: [arrays]} of the shared states saved in a checkpoint ({} if none): the sync
    rules' states, checked as the centre is by `load`.

    Raises CheckpointError naming the file and the state if it cannot be read, if (unless
    `allow_nonfinite`) a state holds NaN or Inf, or if a rule's journal (a state
    ``NAME-journal``, see `platoon.rules.journal`) holds a committed record that does not
    fit the centre or `NAME`, or (unless `allow_nonfinite`) holds NaN or Inf: resuming
    would copy it into them at the first sync.
    """
    path = _resolve(path)
    states: Dict[str, Dict[int, np.ndarray]] = {}
    try:
        with _open(path) as (data, shapes):
            count = sum(1 for name in data.files if name.startswith("param_"))
            sizes = [math.prod(shapes["param_%d" % i]) for i in range(count)]
            for key in data.files:
                if key.startswith("state_"):
                    _, index, name = key.split("_", 2)
                    states.setdefault(name, {})[int(index)] = data[key]
        found = {name: [parts[i] for i in range(len(parts))] for name, parts in states.items()}
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc, "the shared states of checkpoint") from None
    for name, arrays in found.items():
        if _is_journal(name, arrays):
            _check_journal(path, name, arrays, sizes,
                           found.get(name[:-len(_JOURNAL)]), allow_nonfinite)
        elif not allow_nonfinite:
            _refuse_nonfinite(path, arrays,
                              lambda index, name=name: "shared state %r, array %d" % (name, index),
                              "load_states")
    return found


_JOURNAL = "-journal"  # the suffix of a rule's journal state (platoon.rules.downpour)


def _is_journal(name, arrays):
    """Whether shared state `name` is laid out as a journal: a header of int64 [slots, 4],
    then rows of [slots, block] (`platoon.rules.journal.journal_layout`)."""
    if not name.endswith(_JOURNAL) or not arrays:
        return False
    header = arrays[0]
    return header.dtype == np.int64 and header.ndim == 2 and header.shape[1] == 4 and all(
        a.ndim == 2 and a.shape[0] == header.shape[0] for a in arrays[1:])


def _check_journal(path, name, arrays, sizes, base, allow_nonfinite):
    """Raise CheckpointError unless every committed record of journal `name` (`arrays`)
    fits: a flag of 1, a parameter of the centre (`sizes`: its parameters' element counts),
    a range within it and within the rows, rows of the rule's state `base` for it; and
    (unless `allow_nonfinite`) finite values. Records not committed are scratch."""
    header, rows = arrays[0], arrays[1:]
    width = rows[0].shape[1] if rows else 0
    per_param, count = len(rows) - 1, len(sizes)
    for slot, (flag, index, start, n) in enumerate(header.tolist()):
        if flag == 0:
            continue
        if flag != 1:
            problem = "flag %d, not 0 (free) or 1 (committed)" % flag
        elif not 0 <= index < count:
            problem = "a record for parameter %d, and the centre has %d" % (index, count)
        elif not 0 <= n <= width:
            problem = "a record of %d elements, more than its rows' %d" % (n, width)
        elif start < 0 or start + n > sizes[index]:
            problem = "a record for elements [%d, %d) of parameter %d, which has %d" % (
                start, start + n, index, sizes[index])
        elif per_param > 0 and (base is None or len(base) < per_param * count or any(
                base[j * count + index].size < start + n for j in range(per_param))):
            problem = "a record for rows of shared state %r that the checkpoint does not " \
                "hold" % name[:-len(_JOURNAL)]
        else:
            bad = 0 if allow_nonfinite else sum(_count_nonfinite(row[slot, :n]) for row in rows)
            if not bad:
                continue
            raise CheckpointError(
                "checkpoint %s: shared state %r (a sync rule's journal), slot %d: its committed "
                "record holds %d NaN or Inf value(s), which resuming would copy into the "
                "centre; resume from an earlier checkpoint, or pass allow_nonfinite=True (to "
                "Controller or checkpoint.load_states) to use it anyway"
                % (path, name, slot, bad))
        raise CheckpointError(
            "checkpoint %s: shared state %r (a sync rule's journal), slot %d: %s, so it does "
            "not fit the centre it was saved with; the file is damaged: resume from an "
            "earlier copy" % (path, name, slot, problem))
