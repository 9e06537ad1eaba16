"""Benchmark samples, medians over repeated runs, and the printed results tables; sections
made of independent measurements (`run_measurements`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MB = 1_000_000
"""MB/s in the tables is 10^6 bytes per second."""


@dataclass(frozen=True)
class Sample:
    """One timed run: how many records (or writes) and bytes went through in how long."""

    records: int
    log_bytes: int
    payload_bytes: int
    seconds: float
    group_commits: int = 0
    """How often the durable offset moved during the run (sync flush only): one per fsync batch."""

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def records_per_commit(self) -> str:
        return f"{self.records / self.group_commits:,.1f}" if self.group_commits else ""

    @property
    def log_mb_per_s(self) -> float:
        return self.log_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    @property
    def payload_mb_per_s(self) -> float:
        return self.payload_bytes / MB / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Row:
    """One line of the results table: a measurement repeated one or more times."""

    name: str
    size: str
    samples: list[Sample] = field(default_factory=list)

    def median(self) -> Sample:
        """The run with the median rate (the lower middle one for an even count)."""
        ordered = sorted(self.samples, key=lambda sample: sample.records_per_s)
        return ordered[(len(ordered) - 1) // 2]


@dataclass(frozen=True)
class Target:
    """A goal printed next to the figures, with PASS or MISS."""

    name: str
    value: str
    goal: str
    passed: bool


@dataclass
class Report:
    """Everything one benchmark section measured, ready to print."""

    title: str
    rows: dict[str, Row] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def declare(self, key: str, name: str, size: str) -> None:
        """Fix the table position and label of measurement ``key`` before it runs."""
        self.rows.setdefault(key, Row(name, size))

    def add(self, key: str, sample: Sample) -> None:
        """Record one run of a declared measurement."""
        self.rows[key].samples.append(sample)

    def median(self, key: str) -> Sample | None:
        row = self.rows.get(key)
        return row.median() if row and row.samples else None

    def render(self) -> str:
        """The results and targets tables as text."""
        rows = [row for row in self.rows.values() if row.samples]
        parts = [self.title, "", _render_rows(rows)]
        if self.targets:
            parts += ["", _render_targets(self.targets)]
        if self.notes:
            parts += [""] + [f"note: {note}" for note in self.notes]
        return "\n".join(parts)


def microseconds_text(microseconds: float | None) -> str:
    """A per-message CPU figure for a table ("?" when it was not measured)."""
    return "?" if microseconds is None else f"{microseconds:,.1f} us"


def _table(header: list[str], lines: list[list[str]], right: Callable[[int], bool]) -> str:
    """Align columns; column ``i`` is right-aligned when ``right(i)``."""
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        cells = [cell.rjust(w) if right(i) else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths))]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(line) for line in lines)])


def _render_rows(rows: list[Row]) -> str:
    header = ["measurement", "size", "runs", "records/s", "log MB/s", "payload MB/s", "records/s min..max",
              "records/fsync"]
    lines = []
    for row in rows:
        median = row.median()
        rates = [sample.records_per_s for sample in row.samples]
        lines.append([row.name, row.size, str(len(row.samples)), f"{median.records_per_s:,.0f}",
                      f"{median.log_mb_per_s:,.1f}", f"{median.payload_mb_per_s:,.1f}",
                      f"{min(rates):,.0f}..{max(rates):,.0f}", median.records_per_commit])
    return _table(header, lines, right=lambda i: i >= 2)


def _render_targets(targets: list[Target]) -> str:
    header = ["target", "measured", "goal", "result"]
    lines = [[t.name, t.value, t.goal, "PASS" if t.passed else "MISS"] for t in targets]
    return _table(header, lines, right=lambda i: i in (1, 2))


@dataclass
class MeasuredSection:
    """A section made of measurements, each a title and its result lines."""

    title: str
    parts: list[tuple[str, list[str]]] = field(default_factory=list)

    def render(self) -> str:
        lines = [self.title]
        for title, body in self.parts:
            lines += [f"  {title}", *(f"    {line}" for line in body)]
        return "\n".join(lines)


Measurement = Callable[[Any, Path, Callable[[str], None]], tuple[str, list[str]]]
"""(settings, work directory, log) -> (title, result lines)."""


def run_measurements(title: str, measurements: Sequence[Measurement], settings: Any,
                     workdir: Path, log: Callable[[str], None]) -> MeasuredSection:
    """Run each measurement in order; ``workdir`` is for those that need files."""
    section = MeasuredSection(title)
    for measure in measurements:
        section.parts.append(measure(settings, workdir, log))
    return section
