"""A push subscription's transform: a JMESPath expression over the event's JSON data.

JMESPath (https://jmespath.org/specification.html) selects and reshapes JSON: ``readings[0]``
picks a value, ``{id: device, temp: readings[0].value}`` builds an object,
``readings[?value > `20`].value`` filters a list. The result is written as compact JSON
(``null`` when the path selects nothing).

Errors: a bad or too long expression raises InvalidArgument at compile time; at run time,
data that is not JSON, too large, or a result that is too large or exceeds the evaluation budget
raises TransformError. TransformError is a SluiceError but not an InvalidArgument: it is about
one event's data, not about a request, and the push engine dead-letters that event.

Cost is bounded whatever the expression and data: data of at most ``MAX_DATA_BYTES``, at most
``MAX_STEPS`` evaluation steps, no intermediate value larger than ``MAX_VALUE_SIZE`` (counted
as the values and characters it holds, shared parts counted each time they appear, so
``[@, @]`` repeated cannot double its way to an enormous result) and a result of at most
``MAX_RESULT_BYTES``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jmespath
from jmespath.visitor import TreeInterpreter

from .errors import InvalidArgument, SluiceError

MAX_EXPRESSION_LENGTH = 1024
MAX_DATA_BYTES = 1 << 20
MAX_RESULT_BYTES = 1 << 20
MAX_STEPS = 250_000
MAX_VALUE_SIZE = 4 << 20


class TransformError(SluiceError):
    """One event's data cannot be transformed: not JSON, too large, or the result is too large."""


class _OverBudget(Exception):
    pass


class _Bounded(TreeInterpreter):
    """JMESPath's interpreter, counting steps and the size of every value it produces."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = MAX_STEPS
        self.sizes: dict[int, tuple[Any, int]] = {}  # id -> (value kept alive, size)

    def visit(self, node: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self.steps -= 1
        if self.steps < 0:
            raise _OverBudget(f"more than {MAX_STEPS} evaluation steps")
        result = super().visit(node, *args, **kwargs)
        if self.size(result) > MAX_VALUE_SIZE:
            raise _OverBudget(f"a value larger than {MAX_VALUE_SIZE} items and characters")
        return result

    def size(self, value: Any) -> int:
        """The values and characters ``value`` holds, shared parts counted each time; memoised
        per container so each is walked once (iteratively: data may nest deeply)."""
        if not isinstance(value, (list, dict)):
            return 1 + len(value) if isinstance(value, str) else 1
        pending = [value]
        while pending:
            top = pending[-1]
            if id(top) in self.sizes:
                pending.pop()
                continue
            children = list(top.values() if isinstance(top, dict) else top)
            missing = [c for c in children if isinstance(c, (list, dict)) and id(c) not in self.sizes]
            if missing:
                pending.extend(missing)
                continue
            pending.pop()
            total = 1 + sum(self.size(c) for c in children) + (
                sum(len(k) for k in top) if isinstance(top, dict) else 0)
            self.sizes[id(top)] = (top, min(total, MAX_VALUE_SIZE + 1))
        return self.sizes[id(value)][1]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def compile_transform(expression: str) -> Callable[[bytes], bytes]:
    """The transform ``expression`` describes; InvalidArgument naming the problem when it is
    not a JMESPath expression or is longer than ``MAX_EXPRESSION_LENGTH``."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidArgument("a transform is a JMESPath expression such as "
                              "'{id: id, temp: readings[0].value}'")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise InvalidArgument(f"the transform is {len(expression)} characters long; the limit "
                              f"is {MAX_EXPRESSION_LENGTH}")
    try:
        parsed = jmespath.compile(expression).parsed
    except Exception as error:  # the parser of untrusted text: any failure is a bad expression
        detail = " ".join(str(error).split())
        raise InvalidArgument(f"the transform is not a JMESPath expression ({detail}); see "
                              "https://jmespath.org/tutorial.html") from None

    def transform(data: bytes) -> bytes:
        if len(data) > MAX_DATA_BYTES:
            raise TransformError(f"the data is {len(data)} bytes; a transform reads at most "
                                 f"{MAX_DATA_BYTES}")
        try:
            document = json.loads(data, parse_constant=_no_constant)
        except (ValueError, RecursionError) as error:
            raise TransformError(f"the data is not JSON ({str(error)[:200]})") from None
        try:
            result = _Bounded().visit(parsed, document)
            text = json.dumps(result, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except _OverBudget as error:
            raise TransformError(f"the transform needs {error}; simplify the expression") from None
        except Exception as error:  # JMESPath's run-time type errors and the like
            raise TransformError(f"the transform failed on this data ({str(error)[:200]})") from None
        out = text.encode()
        if len(out) > MAX_RESULT_BYTES:
            raise TransformError(f"the result is {len(out)} bytes; the limit is {MAX_RESULT_BYTES}")
        return out
    return transform
