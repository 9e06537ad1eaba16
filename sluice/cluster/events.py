"""Counts of what happened to this process's replica group membership, for Prometheus.

Process-wide (a fenced node starts over as a new ``ReplicaNode`` in the same process, and its
history must carry over): ``elections`` this node won, ``fenced`` steps-down, ``truncations`` of
its log on rejoining, ``in_sync_changes`` it recorded as leader.
"""
from __future__ import annotations

from collections import Counter

counts: Counter[str] = Counter()
