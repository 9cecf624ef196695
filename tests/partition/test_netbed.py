"""The partition test bed itself (harness.netbed): real namespaces, real packets.

Each fault is checked from inside the hosts: a UDP datagram or a Redis
round trip that must pass, or must not, and :meth:`NetBed.heal` brings
every path back. Teardown leaves nothing, and a bed whose process died is
swept by the next one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.netbed import NAME_PREFIX, NetBed, sweep_leftovers
from harness.servers import RedisServer

pytestmark = pytest.mark.partition

#: Sends three UDP datagrams to argv[1]:argv[2] (a drop in the sender's own output chain
#: fails the send with EPERM: not an error here).
SEND = """
import socket, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    for _ in range(3):
        try:
            s.sendto(b"ping", (sys.argv[1], int(sys.argv[2])))
        except PermissionError:
            pass
"""
#: Waits up to argv[3] s for a datagram on argv[1]:argv[2]: exit 0 when one came, else 1.
RECEIVE = """
import socket, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.settimeout(float(sys.argv[3]))
    print("ready", flush=True)
    try:
        s.recvfrom(16)
    except OSError:
        sys.exit(1)
"""
PORT = 4000
HOSTS = ("a", "b", "c")


@pytest.fixture
def bed() -> Iterator[NetBed]:
    with NetBed(list(HOSTS)) as net:
        yield net


def _receiver(net: NetBed, target: str, port: int, timeout: float) -> subprocess.Popen[str]:
    """A process on *target* that exits 0 once a datagram reached *port*, 1 after *timeout*."""
    receiver = subprocess.Popen(
        [
            *net.wrapper(target),
            sys.executable, "-c", RECEIVE, net.address(target), str(port), str(timeout),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
    return receiver


def _send(net: NetBed, source: str | None, target: str, port: int) -> None:
    wrapper = net.wrapper(source) if source is not None else []
    send = [sys.executable, "-c", SEND, net.address(target), str(port)]
    subprocess.run([*wrapper, *send], check=True)


#: How long a receiver waits for its datagram: generous, since a sender is a new process
#: that a loaded machine may take a while to start (all pairs wait at once, see _blocked).
RECEIVE_TIMEOUT = 5.0


def _arrives(
    net: NetBed, source: str | None, target: str, timeout: float = RECEIVE_TIMEOUT
) -> bool:
    """True when a datagram sent from *source* (None: the controller) reaches *target*."""
    receiver = _receiver(net, target, PORT, timeout)
    _send(net, source, target, PORT)
    return receiver.wait(timeout + 10) == 0


def _blocked(net: NetBed) -> list[tuple[str, str]]:
    """The (source, target) pairs of hosts between which a datagram does not arrive.

    Every pair at once, each on a port of its own, so that the wait for the
    blocked ones is paid once.
    """
    pairs = [(s, t) for s in HOSTS for t in HOSTS if s != t]
    receivers = [
        _receiver(net, target, PORT + index, RECEIVE_TIMEOUT)
        for index, (_, target) in enumerate(pairs)
    ]
    for index, (source, target) in enumerate(pairs):
        _send(net, source, target, PORT + index)
    arrived = [receiver.wait(RECEIVE_TIMEOUT + 10) == 0 for receiver in receivers]
    return [pair for pair, came in zip(pairs, arrived, strict=True) if not came]


def test_cut_isolate_and_heal_act_on_the_named_paths_only(bed: NetBed) -> None:
    """cut drops a pair both ways, isolate a host but the controller, heal undoes them."""
    assert _blocked(bed) == []
    bed.cut("a", "b")
    assert _blocked(bed) == [("a", "b"), ("b", "a")]
    bed.heal()
    bed.isolate("c")
    assert _blocked(bed) == [("a", "c"), ("b", "c"), ("c", "a"), ("c", "b")]
    assert _arrives(bed, None, "c")  # the controller still reaches it
    bed.heal()
    assert _blocked(bed) == []


def test_one_way_cut_drops_one_direction_only(bed: NetBed) -> None:
    """cut_one_way(a, b): what a sends to b is lost; what b sends reaches a."""
    bed.cut_one_way("a", "b")
    assert _blocked(bed) == [("a", "b")]
    bed.heal()
    assert _blocked(bed) == []


def test_lose_drops_a_share_and_slow_delays_one_server(bed: NetBed, tmp_path: Path) -> None:
    """lose(100) drops every packet to one host; slow() adds its delay to each round trip."""
    server = RedisServer(tmp_path, host=bed.address("b"), wrapper=bed.wrapper("b")).start()
    try:

        def ping(timeout: float = 3.0) -> float | None:
            began = time.monotonic()
            command = ["redis-cli", "-h", bed.address("b"), "-p", str(server.port), "ping"]
            try:
                done = subprocess.run(
                    [*bed.wrapper("a"), *command],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return None
            return time.monotonic() - began if done.stdout.strip() == "PONG" else None

        plain = ping()
        assert plain is not None
        bed.lose("a", 100, to="b")
        assert ping(1.5) is None
        bed.heal()
        bed.slow("a", "b", server.port, delay_ms=800)
        slowed = ping()
        assert slowed is not None and slowed >= 0.8, slowed
        bed.heal()
        healed = ping()
        assert healed is not None and healed < 0.8, healed
    finally:
        server.stop()


def test_close_removes_everything_and_a_dead_bed_is_swept(tmp_path: Path) -> None:
    """A bed's namespaces and interface go with close(); a killed process's bed is swept."""
    with NetBed(["x"]) as net:
        index = net.index
        namespace = net.hosts["x"].namespace
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert namespace not in listed.stdout
    # A process that builds a bed and is killed before it closes it.
    script = (
        "import sys, time\n"
        "from harness.netbed import NetBed\n"
        "net = NetBed(['y']).start()\n"
        "print(net.hosts['y'].namespace, flush=True)\n"
        "time.sleep(60)\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    left = proc.stdout.readline().strip()
    proc.kill()
    proc.wait()
    assert left.startswith(NAME_PREFIX)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert left in listed.stdout  # left behind by the dead process
    sweep_leftovers()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert left not in listed.stdout
    assert index is not None


def test_two_beds_side_by_side_never_meet(bed: NetBed) -> None:
    """A second bed takes another index and subnet; its hosts cannot reach the first's."""
    with NetBed(["a"]) as other:
        assert other.index != bed.index
        assert other.subnet != bed.subnet
        assert other.hosts["a"].namespace != bed.hosts["a"].namespace
        send = [sys.executable, "-c", SEND, bed.address("a"), str(PORT)]
        receiver = subprocess.Popen(
            [
                *bed.wrapper("a"),
                sys.executable, "-c", RECEIVE, bed.address("a"), str(PORT), "0.5",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        # No route from the other bed's host to this bed's subnet: the send fails or is lost.
        subprocess.run([*other.wrapper("a"), *send], check=False, capture_output=True)
        assert receiver.wait(10) == 1
