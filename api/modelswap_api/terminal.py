"""Text from outside (a model's name, a YAML file's values, an agent's message) made safe to
print to a terminal: `printable` writes every control and format character as its Python
escape, so `\\x1b]0;owned\\x07` or `\\x1b[2J` in a model's name shows as those characters
instead of retitling or clearing the user's terminal, and a line break or a bidi override
(`\\u202e`) cannot forge or reorder what a line says."""

from __future__ import annotations

import unicodedata

#: Unicode categories escaped: controls (C0, DEL, C1), format characters (bidi overrides,
#: zero-width joiners), line and paragraph separators, unassigned and surrogates.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cn", "Cs"})


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str) -> str:
    """`text` with every character a terminal would act on written as its escape."""
    if text.isprintable():
        return text  # most names: no copy
    return "".join(
        _escape(c) if unicodedata.category(c) in _ESCAPED_CATEGORIES else c for c in text
    )
