"""Regular expressions written by administrators or clients, compiled with RE2.

Python's ``re`` backtracks: ``^([a-z0-9]+-?)+$`` against 26 letters and a ``!`` takes seconds
and, on the event loop, stalls every client. RE2 (the ``google-re2`` package) runs in time
linear in the text, whatever the expression, because it never backtracks; in exchange it
refuses the constructs that need backtracking (backreferences, lookarounds, atomic groups,
possessive quantifiers). Every expression Sluice takes from outside goes through
``compile_untrusted``, which refuses those with an error naming the construct.

Pure functions; thread-safe.
"""

from __future__ import annotations

import re2

from .errors import InvalidArgument
from .untrusted import clip

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # refusals are reported to the caller, not printed to stderr

Pattern = re2._Regexp
"""A compiled RE2 expression: ``search``, ``match`` and ``fullmatch`` as in ``re``."""

_CONSTRUCTS = (  # (what RE2's error mentions, what to call it)
    ("(?=", "a lookahead (?=...)"), ("(?!", "a negative lookahead (?!...)"),
    ("(?<=", "a lookbehind (?<=...)"), ("(?<!", "a negative lookbehind (?<!...)"),
    ("(?>", "an atomic group (?>...)"), ("++", "a possessive quantifier"),
    ("*+", "a possessive quantifier"), ("?+", "a possessive quantifier"),
    ("}+", "a possessive quantifier"),
)
_BACKREFERENCE_ESCAPES = tuple(f"\\{digit}" for digit in range(1, 10))
UNSUPPORTED = ("backreferences (\\1), lookarounds ((?=...), (?!...), (?<=...), (?<!...)), "
               "atomic groups and possessive quantifiers")


def compile_untrusted(expression: str, what: str) -> Pattern:
    """``expression`` compiled by RE2; InvalidArgument naming ``what`` (e.g. "the read
    expression") and the construct RE2 refused when it cannot be compiled."""
    try:
        return re2.compile(expression, _OPTIONS)
    except re2.error as error:
        reason = _text(error)
        raise InvalidArgument(f"{what} {clip(expression)} cannot be used: {_explain(reason)}") \
            from None


def _text(error: re2.error) -> str:
    detail = error.args[0] if error.args else ""
    return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)


def _explain(reason: str) -> str:
    """What RE2 refused, in words an administrator can act on."""
    construct = next((name for marker, name in _CONSTRUCTS if marker in reason), None)
    if construct is None and reason.endswith(_BACKREFERENCE_ESCAPES):
        construct = "a backreference (\\1 to \\9)"
    if construct is None:
        return f"it is not a regular expression RE2 accepts ({reason})"
    return (f"it uses {construct}, which Sluice does not run: expressions are matched by RE2, "
            f"in time linear in the name, so {UNSUPPORTED} are refused; rewrite it without "
            f"them ({reason})")
