"""What the launcher shows of its children: their logs followed line by line, and text made
harmless for a terminal and fitted to its width.

Bounded whatever the children write: a look at a log reads at most `CHUNK` bytes, a log
that runs more than `BACKLOG` bytes ahead of what was shown is skipped to its last `KEEP`
bytes (a note says how much and where the whole is), and a line longer than `MAX_LINE` bytes
is cut (saying so) rather than held whole. Control characters other than tab and newline (an
escape sequence that sets the window title or erases a line, a carriage return that moves
back over the prefix) are shown as text (``\\x1b``, ``\\r``) instead of acting.
"""

import os
import re
import unicodedata
from typing import List, Optional, Sequence

CHUNK = 1 << 20  # the most of a log read per look while the job runs
BACKLOG = 8 << 20  # unread output beyond this is skipped but for its last KEEP bytes
KEEP = 1 << 20
MAX_LINE = 16 << 10  # the longest line shown (bytes); a longer one is cut
TAIL_BYTES = 64 << 10  # what `tail` reads from the end of a log

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape(match) -> str:
    char = match.group()
    return "\\r" if char == "\r" else "\\x%02x" % ord(char)


def visible(text: str) -> str:
    """`text` with every control character but tab and newline (C0, DEL and C1: escape
    sequences, carriage returns, backspaces) written out as text (``\\x1b``, ``\\r``), so that
    it shows on a terminal instead of acting on it."""
    return _CONTROL.sub(_escape, text)


def _width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def columns(text: str) -> int:
    """The terminal columns `text` (without control characters) takes: wide characters
    (CJK, most emoji) take two, combining marks none."""
    return sum(_width(char) for char in text) if not text.isascii() else len(text)


def _cut(text: str, width: int) -> str:
    """`text` cut to at most `width` columns, ending with "…" when cut."""
    if columns(text) <= width:
        return text
    taken, used = [], 0
    for char in text:
        if used + _width(char) > width - 1:
            break
        taken.append(char)
        used += _width(char)
    return "".join(taken) + "…"


def fit(parts: Sequence[str], width: int, sep: str = " | ") -> str:
    """`parts` joined by `sep` in fewer than `width` columns (a line as wide as the terminal
    wraps on some): as many whole parts as fit, then "+K more" for those left out; the
    first part alone is cut ("…") when even it does not fit."""
    room = width - 1
    shown: List[str] = []
    used = 0
    for index, part in enumerate(parts):
        cost = columns(part) + (len(sep) if shown else 0)
        left = len(parts) - index - 1
        more = len(sep) + len("+%d more" % left) if left else 0
        if used + cost + more > room:
            break
        shown.append(part)
        used += cost
    if len(shown) == len(parts):
        return sep.join(shown)
    if not shown:
        return _cut(parts[0], room) if parts else ""
    while shown and used + len(sep) + len("+%d more" % (len(parts) - len(shown))) > room:
        used -= columns(shown.pop()) + len(sep)  # (a longer count: one part fewer)
    return sep.join(shown + ["+%d more" % (len(parts) - len(shown))])


def _line(data: bytes) -> str:
    return visible(data.decode(errors="replace").rstrip("\r"))


class LogFollower:
    """Reads a process's log as it grows, line by line, within the bounds above."""

    def __init__(self, path: str):
        self.path = path
        self._read_to = 0  # how far the log has been read
        self._partial = b""  # the start of a line not yet ended (at most MAX_LINE bytes)
        self._dropping = False  # in a line already cut: its rest is not shown
        self._mid_line = False  # showing resumed inside a line (after a skip)
        self._until: Optional[int] = None  # where reading stops (`stop_at`), if set

    def stop_at(self, offset: Optional[int] = None) -> None:
        """Read no further than `offset` (default: the log's size now): what the process
        writes from now on stays in its log."""
        if offset is None:
            try:
                offset = os.path.getsize(self.path)
            except OSError:
                offset = self._read_to
        self._until = offset

    def new_lines(self, final: bool = False) -> List[str]:
        """The lines (made `visible`) the log gained since the last call: at most `CHUNK`
        bytes of it, or with `final` all of it and the unended last line too. A log more than
        `BACKLOG` bytes ahead is skipped to its last `KEEP` bytes, with a line saying how many
        bytes were skipped and where they are."""
        lines: List[str] = []
        try:
            with open(self.path, "rb") as f:
                end = os.fstat(f.fileno()).st_size
                if self._until is not None:
                    end = min(end, self._until)
                if end - self._read_to > BACKLOG:
                    self._skip(f, end, lines)
                size = max(0, end - self._read_to)
                f.seek(self._read_to)
                data = f.read(size if final else min(size, CHUNK))
        except OSError:
            return lines
        self._read_to += len(data)
        self._take(data, lines)
        if final and (self._partial or self._mid_line) and not self._dropping:
            lines.append(self._whole())
        return lines

    def _skip(self, f, end: int, lines: List[str]) -> None:
        """Skip to the start of the first line that begins in the last KEEP bytes before `end`
        (or to KEEP bytes before it, inside a line, if none does), from the start of the
        pending line: no line is shown cut without saying so."""
        f.seek(end - KEEP)
        newline = f.read(KEEP).find(b"\n")
        resume = end - KEEP + newline + 1 if newline >= 0 else end - KEEP
        start = self._read_to if self._dropping else self._read_to - len(self._partial)
        lines.append("(platoon-launcher: skipped %d bytes of output here, written faster "
                     "than shown; all of it is in %s, from byte %d)"
                     % (resume - start, self.path, start))
        self._partial = b""
        self._dropping = False
        self._mid_line = newline < 0
        self._read_to = resume

    def _whole(self) -> str:
        """The pending line as shown, marked when it starts inside a skipped line."""
        text = ("… " if self._mid_line else "") + _line(self._partial)
        self._partial = b""
        self._mid_line = False
        return text

    def _take(self, data: bytes, lines: List[str]) -> None:
        pos = 0
        while pos < len(data):
            newline = data.find(b"\n", pos)
            stop = len(data) if newline < 0 else newline
            if not self._dropping:
                room = MAX_LINE - len(self._partial)
                if stop - pos > room:  # cut it: its rest is dropped up to its end
                    self._partial += data[pos:pos + room]
                    lines.append("%s … (platoon-launcher: line cut at %d bytes; all of it is "
                                 "in %s)" % (self._whole(), MAX_LINE, self.path))
                    self._dropping = True
                else:
                    self._partial += data[pos:stop]
            if newline < 0:
                break
            if self._dropping:
                self._dropping = False
            else:
                lines.append(self._whole())
            pos = newline + 1


def tail(path: str, lines: int = 20) -> str:
    """The last `lines` lines of the log at `path` (from its last `TAIL_BYTES` at most; lines
    longer than `MAX_LINE` cut, saying so), made `visible`; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return ""
    parts = data.split(b"\n")
    inside = size > TAIL_BYTES  # it starts inside a line: shown marked "… " if it is the only one
    if inside and len(parts) > 1:
        parts, inside = parts[1:], False
    if parts and parts[-1] == b"":
        parts.pop()
    shown = []
    for index, part in enumerate(parts[-lines:]):
        text = ("… " if inside and index == 0 else "") + _line(part[:MAX_LINE])
        if len(part) > MAX_LINE:
            text += " … (platoon-launcher: line cut at %d bytes; all of it is in %s)" % (
                MAX_LINE, path)
        shown.append(text + "\n")
    return "".join(shown)
