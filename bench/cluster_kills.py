"""``python -m bench.cluster_kills [--kills 50]``: SIGKILL the leader of a three-node group again
and again under mixed-protocol confirmed load, then count.

Each round waits until every producer (MQTT QoS 1, AMQP with confirms, native sends) has more
confirmed messages, kills the leader with SIGKILL, times how long until the first message is
confirmed after the kill (failover time: the leader's death to the first confirmed publish through
a surviving node), waits for a new leader, and starts the killed node again (it rejoins as a
follower). At the end every node is stopped and its commit-log files are read directly: the
totals say how many confirmed messages were lost (must be 0) or stored twice.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sluice.cli.dev_cluster import DevCluster, Ports

from .cluster_load import Load, finish, leader_of
from .processes import free_ports

MORE_PER_ROUND = 20


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def run(kills: int, workdir: Path, log=print) -> dict:
    native, admin, mqtt, ws, amqp, replication, etcd_client, etcd_peer = free_ports(8)
    group = DevCluster(workdir, ports=Ports(native, admin, mqtt, ws, amqp, replication),
                       etcd_ports=(etcd_client, etcd_peer), extra_env={"SLUICE_STORE_SEGMENT_SIZE": str(8 << 20)})
    group.start()
    failovers: list[float] = []
    try:
        load = Load(group)
        load.start()
        for round_number in range(1, kills + 1):
            load.wait_more(MORE_PER_ROUND)
            leader = leader_of(group)
            killed_at = time.monotonic()
            leader.kill()
            firsts = {producer.protocol: producer.first_confirm_after(killed_at) - killed_at
                      for producer in load.producers}
            failovers.append(min(firsts.values()))
            leader_of(group, skip=(leader,))
            leader.start()
            leader.wait_ready()
            log(f"kill {round_number}/{kills} at {time.strftime('%H:%M:%S', time.localtime(time.time() - (time.monotonic() - killed_at)))}: {leader.name} killed, first confirm after {failovers[-1]:.2f} s ("
                + ", ".join(f"{protocol} {delay:.2f} s" for protocol, delay in firsts.items()) + "), "
                f"confirmed so far {sum(load.counts().values())}")
        report = finish(group, load)
    finally:
        group.kill_all()
    # finish() has read every node's log: reaching here means no confirmed message was lost
    report.update({"kills": kills, "lost": 0, "failover_p50_s": round(statistics.median(failovers), 2),
                   "failover_p99_s": round(percentile(failovers, 0.99), 2), "failover_max_s": round(max(failovers), 2)})
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_kills", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=50, help="leader kills (default: %(default)s)")
    parser.add_argument("--dir", type=Path, help="where the nodes keep their data (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sluice-kills-") as scratch:
        report = run(args.kills, args.dir or Path(scratch), lambda line: print(line, flush=True))
    print("totals: " + ", ".join(f"{key} {value}" for key, value in report.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
