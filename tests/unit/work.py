"""Counting work without a clock: the function calls (Python and built-in) an action makes.

A cost test compares the calls an operation makes on inputs of two sizes: linear work grows with
the input, quadratic work with its square. Calls are counted by a profile hook on the calling
thread only (``sys.setprofile``), so a loaded machine counts exactly what an idle one does. A
budget stops a runaway (quadratic) action early with ``WorkExceeded`` instead of letting it run
for minutes.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WorkExceeded(AssertionError):
    """The action made more calls than its budget allowed."""


def count_calls(action: Callable[[], T], budget: int | None = None) -> tuple[int, T]:
    """(calls ``action`` made, its result); WorkExceeded once it passes ``budget`` calls."""
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1
            if budget is not None and calls > budget:
                sys.setprofile(None)
                raise WorkExceeded(f"more than {budget} calls")

    sys.setprofile(profile)
    try:
        result = action()
    finally:
        sys.setprofile(None)
    return calls, result
