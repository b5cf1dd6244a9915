"""Command lines: what the launcher and the node runners both do to their argv."""

from typing import List, Sequence


def word(value) -> str:
    """A setting's value as a word of an argv (floats as repr: they read back exactly)."""
    return repr(value) if isinstance(value, float) else str(value)


def join_option_values(argv: Sequence[str], options: Sequence[str]) -> List[str]:
    """`argv` with each of `options` written as its own word (``-c VALUE``) joined to the next
    word (``-c=VALUE``), so that argparse takes a VALUE that looks like an option, such as
    ``--no-baseline``. Words after ``--`` are left as they are."""
    joined: List[str] = []
    words = list(argv)
    while words:
        word = words.pop(0)
        if word == "--":
            return joined + [word] + words
        if word in options and words:
            word += "=" + words.pop(0)
        joined.append(word)
    return joined

