"""Secure mode seals payloads end to end: a broker with a frame tap records every frame it
handles and, when told, alters, swaps or forges what it forwards.

The broker, the workers and the driver run in this process, on loopback TCP, each with its
own ZeroMQ context and its own key; the same run without keys is the control that shows the
tap does see values when nothing is sealed.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from helpers import two_rank_keys, wait_until

import mpl.driver as mp
from mpl.broker.daemon import Broker
from mpl.wire import ClusterSpec, decode, encode
from mpl.wire.codec import MAGIC_FRAME, Pickled, from_wire, to_wire
from mpl.wire.curve import Curve
from mpl.wire.decoder import Opaque, OpaqueRecord
from mpl.wire.jobs import Exec, Lit, Program
from mpl.wire.keys import load_keypair
from mpl.wire.record import Record, record_fields
from mpl.wire.seal import Sealer, program_context
from mpl.wire.sealed import BOX_MAGIC, Sealed, is_sealed
from mpl.wire.sealed_exec import SEALED_EXEC_MAGIC, split_own
from mpl.wire.sessions import Reply
from mpl.worker.daemon import Worker

Frames = list[Any]
# the record to send instead (a list: several, in order), or None to send it unchanged
Alter = Callable[[Record], Record | list[Record] | None]


class Tap:
    """Stands in for the broker's ROUTER: records every message it receives and sends, and
    lets the test rewrite the messages it sends (``alter``: the decoded record in, the
    record or records to send instead, or None to send it unchanged)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.seen: list[Frames] = []
        self.alter: Alter | None = None
        self.rank_of: Callable[[bytes], int] = lambda peer: 0  # a worker's rank, by peer
        # frame-level stand-ins, in the codec's form (mpl.wire.codec.from_wire; a Wire
        # handed back goes as it is): what the broker receives (its routing id first), and
        # what it sends (routing id and frames in, what to send out)
        self.take: Callable[[Frames], Frames] | None = None
        self.rewrite: Callable[[bytes, Frames], list[tuple[bytes, Frames]]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def recv_multipart(self, *args: Any, **kw: Any) -> Frames:
        frames: Frames = self._sock.recv_multipart(*args, **kw)
        if self.take is not None:  # routing id first, then the codec's form (or Wire's)
            frames = [frames[0], *_wired(self.take([frames[0], *from_wire(frames[1:])])[1:])]
        self.seen.append([memoryview(f).tobytes() for f in from_wire(frames[1:])])
        return frames

    def send_multipart(self, frames: Frames, *args: Any, **kw: Any) -> Any:
        # the callbacks see the codec's form (mpl.wire.codec.from_wire), the socket the wire's
        to, body = frames[0], from_wire(list(frames)[1:])
        if self.rewrite is not None:  # frames in, (routing id, frames) to send instead out
            for peer, out in self.rewrite(bytes(to), body):
                self.seen.append([memoryview(f).tobytes() for f in out])
                self._sock.send_multipart([peer, *_wired(out)], *args, **kw)
            return None
        if self.alter is not None:
            if bytes(body[0]) == SEALED_EXEC_MAGIC:  # an Exec, its rank's box after it
                msg: Record = as_record(body, self.rank_of(bytes(to)))
            else:
                msg = decode(body, unpickle=False)
            changed = self.alter(msg)
            if isinstance(changed, list):  # sent before the last one, to the same peer
                for extra in changed[:-1]:
                    self._sock.send_multipart([to, *to_wire(as_frames(extra))], *args, **kw)
                changed = changed[-1]
            if changed is not None:
                body = as_frames(changed)
        self.seen.append([memoryview(f).tobytes() for f in body])
        return self._sock.send_multipart([to, *to_wire(body)], *args, **kw)


class Wire(list[Any]):
    """Frames a tap's callback hands back as they go on the wire (not the codec's form):
    what a peer of another wire version, or a hostile one, sends."""


def _wired(frames: Frames) -> Frames:
    return list(frames) if isinstance(frames, Wire) else to_wire(frames)


def as_record(frames: Frames, rank: int) -> Exec:
    """A sealed Exec to ``rank`` (``mpl.wire.sealed_exec``: the magic, then its header and
    its box) as the record of the codec's shape: the box in the bindings, keyed by rank."""
    assert len(frames) == 2
    header, box = split_own(bytes(frames[1]))
    msg = decode([MAGIC_FRAME, header], unpickle=False)
    assert isinstance(msg, Exec) and msg.bindings == {}
    return dataclasses.replace(msg, bindings={rank: box})


def as_frames(msg: Record) -> Frames:
    """What the broker sends for ``msg``: an Exec of one rank's compact box in the sealed
    Exec's shape (the box after the header), anything else encoded."""
    if isinstance(msg, Exec) and len(msg.bindings) == 1:
        (box,) = msg.bindings.values()
        if type(box) is bytes:
            header = encode(dataclasses.replace(msg, bindings={}))[1]
            return [SEALED_EXEC_MAGIC, header + msgpack.packb(box)]
    return encode(msg)


class Setup:
    def __init__(self, root: Path, secure: bool) -> None:
        spec = ClusterSpec.simple(2)
        self.curves: dict[str, Curve | None] = {n: None for n in ("broker", "node0", "node1")}
        self.driver_key: Path | None = None
        if secure:
            spec, secrets = two_rank_keys(root, spec)
            self.curves = {n: Curve(load_keypair(secrets[n]), spec) for n in self.curves}
            self.driver_key = secrets["analyst"]
        self.spec = spec
        self.broker = Broker(spec, "tcp://127.0.0.1:0", curve=self.curves["broker"])
        self.tap = Tap(self.broker.router)
        by_peer = self.broker.state.registry.by_peer
        self.tap.rank_of = lambda peer: by_peer[peer].rank
        self.broker.router = self.tap  # type: ignore[assignment]  # a stand-in (see Tap)
        self.broker.start()
        self.workers = [
            Worker(
                self.broker.address,
                rank,
                curve=self.curves[f"node{rank}"],
                data_root=root / f"data{rank}",
            ).start()
            for rank in range(2)
        ]
        for w in self.workers:
            assert w.joined.wait(15), "worker did not join"
        self.ctx = mp.connect(
            self.broker.address,
            key=self.driver_key,
            cluster=spec if secure else None,
            timeout=20,
        )

    def close(self) -> None:
        self.ctx.close()
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(5)
        self.broker.stop()
        self.broker.join(5)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[[bool], Setup]]:
    made: list[Setup] = []

    def build(secure: bool) -> Setup:
        made.append(Setup(tmp_path, secure))
        return made[-1]

    yield build
    for s in made:
        s.close()


HOST_MARK = struct.pack("<d", 777.125) * 8
RESULT_MARK = struct.pack("<d", 4242.4242) * 8
TEXT_MARK = b"VALUE-MARKER-91c2"
CODE_MARK = b"CODE-MARKER-7f3a"


def _walk(obj: Any, found: dict[str, int]) -> None:
    if isinstance(obj, Pickled):
        found["pickles"] += 1
    elif isinstance(obj, OpaqueRecord):
        found[obj.tag] = found.get(obj.tag, 0) + 1
        for f in obj.fields:
            _walk(f, found)
    elif isinstance(obj, Opaque):
        found["arrays"] += obj.code == 1
    elif is_sealed(obj):
        found["sealed"] += 1  # ciphertext (a record or a compact box): not walked
    elif isinstance(obj, Record):
        found[obj.TAG] = found.get(obj.TAG, 0) + 1
        for f in record_fields(obj):
            _walk(f, found)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _walk(x, found)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(k, found)
            _walk(v, found)


def _what_the_broker_saw(tap: Tap) -> tuple[bytes, dict[str, int]]:
    found = {"pickles": 0, "arrays": 0, "sealed": 0}
    for frames in tap.seen:
        _walk(decode(frames, unpickle=False), found)
    return b"".join(b"".join(f) for f in tap.seen), found


def _workload() -> None:
    host = np.full(64, 777.125)
    doubled = mp.device("P0")(lambda v: v * 2)(host)  # a host value bound into a job
    moved = mp.device("P1")(lambda v: v.sum())(doubled)  # P0 -> P1, peer to peer
    assert mp.fetch(moved) == 777.125 * 2 * 64
    result = mp.device("P0")(lambda: np.full(64, 4242.4242))()
    assert np.array_equal(mp.fetch(result), np.full(64, 4242.4242))

    @mp.function
    def labelled() -> Any:  # a traced job: its output comes back inline, in Done
        return mp.device("P1")(lambda: "VALUE-MARKER-91c2")()

    assert mp.fetch(labelled()) == "VALUE-MARKER-91c2"
    assert mp.fetch(mp.device("P1")(lambda: len("CODE-MARKER-7f3a"))()) == 16
    secret = mp.put("SP0", np.full(4, 31337.0))  # shares made by the driver, one per member
    assert np.allclose(mp.fetch(secret), 31337.0)  # reconstructed here from fetched shares


@pytest.mark.spu
@pytest.mark.parametrize("secure", [True, False], ids=["sealed", "plaintext-control"])
def test_broker_tap_sees_no_value_no_share_no_code(
    make: Callable[[bool], Setup], secure: bool
) -> None:
    setup = make(secure)
    with setup.ctx:
        _workload()
    raw, found = _what_the_broker_saw(setup.tap)
    leaks = {
        "host value": HOST_MARK in raw,
        "result": RESULT_MARK in raw,
        "inline text": TEXT_MARK in raw,
        "code": CODE_MARK in raw,
        "shares": found.get("spushare", 0) > 0,
        "pickles": found["pickles"] > 0,
        "arrays": found["arrays"] > 0,
    }
    if secure:
        assert not any(leaks.values()), leaks
        assert found["sealed"] >= 10
    else:  # the control: the same tap sees everything when nothing is sealed
        assert all(leaks.values()), leaks


def _flip(sealed: Sealed | bytes) -> Sealed | bytes:
    if isinstance(sealed, bytes):  # a compact box: flip a byte of its ciphertext
        flipped = bytearray(sealed)
        flipped[-20] ^= 1
        assert flipped.startswith(BOX_MAGIC)
        return bytes(flipped)
    parts = list(sealed.parts)
    first = bytearray(memoryview(parts[0]).tobytes())
    first[len(first) // 2] ^= 1
    parts[0] = bytes(first)
    return Sealed(sealed.sender, sealed.salt, sealed.sizes, parts)


def test_a_broker_that_alters_or_swaps_payloads_fails_the_job(
    make: Callable[[bool], Setup],
) -> None:
    setup = make(True)
    tap = setup.tap
    kept: dict[str, Any] = {}

    def alter_exec(msg: Record) -> Record | None:
        if isinstance(msg, Exec) and 0 in msg.bindings:
            sealed = msg.bindings[0]
            assert is_sealed(sealed)
            return dataclasses.replace(msg, bindings={0: _flip(sealed)})
        return None

    def replay_exec(msg: Record) -> Record | None:
        if isinstance(msg, Exec) and 0 in msg.bindings:
            if "exec" not in kept:
                kept["exec"] = msg.bindings[0]
                return None
            return dataclasses.replace(msg, bindings={0: kept["exec"]})
        return None

    def replay_reply(msg: Record) -> Record | None:
        if isinstance(msg, Reply) and is_sealed(msg.value):
            if "reply" not in kept:
                kept["reply"] = msg.value
                return None
            return Reply(msg.req, kept["reply"])
        return None

    def alter_result(msg: Record) -> Record | None:
        if isinstance(msg, Reply) and is_sealed(msg.value):
            return Reply(msg.req, _flip(msg.value))
        return None

    with setup.ctx:
        add = mp.device("P0")(lambda v: v + 1)
        tap.alter = alter_exec
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            add(np.ones(3))
        tap.alter = replay_exec  # the inputs of one job, replayed into the next
        add(np.ones(3))
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            add(np.full(3, 5.0))
        tap.alter = None
        big = 20_000  # larger than what comes back inline with a job: fetched
        one, two = add(np.zeros(big)), add(np.ones(big))
        tap.alter = replay_reply  # the answer to one fetch, given for another
        assert np.array_equal(mp.fetch(one), np.ones(big))
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            mp.fetch(two)
        tap.alter = alter_result
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            mp.fetch(two)
        tap.alter = None  # and the cluster keeps serving honest traffic
        assert np.array_equal(mp.fetch(two), np.full(big, 2.0))


class Evil:
    """Unpickling this creates the file at ``path``: code a hostile broker wants run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def test_a_hostile_broker_cannot_make_a_worker_run_code(
    make: Callable[[bool], Setup], tmp_path: Path
) -> None:
    setup = make(True)
    marker = tmp_path / "pwned"
    broker_keys = setup.curves["broker"]
    assert broker_keys is not None
    nodes = {f"node:node{r}": setup.spec.nodes[r].curve_key for r in range(2)}
    # the broker's own key, claiming to be the listed driver
    forger = Sealer(broker_keys.keys.secret, "driver:analyst", nodes)

    def forge_program(msg: Record) -> Record | None:
        if isinstance(msg, Program):
            context = program_context(msg.digest)
            forged = {
                r: forger.seal_record(Evil(str(marker)), f"node:node{r}", context, safe=False)
                for r in range(2)
            }
            return Program(msg.digest, None, forged)
        return None

    def plain_pickle(msg: Record) -> Record | None:
        if isinstance(msg, Exec):
            bindings = {r: [Lit(Evil(str(marker)))] for r in msg.bindings}
            return Exec(msg.session, msg.job, msg.digest, msg.ranks, bindings)
        return None

    errors_before = sum(w.protocol_errors for w in setup.workers)
    with setup.ctx:
        setup.tap.alter = forge_program
        with pytest.raises(mp.AuthenticationError, match="refused"):
            mp.device("P0")(lambda: 1)()
        setup.tap.alter = plain_pickle
        with pytest.raises(mp.MplError):
            mp.device("P0")(lambda v: v)(np.ones(2))
        setup.tap.alter = None
        assert mp.fetch(mp.device("P0")(lambda: 41)()) == 41
    assert not marker.exists()
    wait_until(
        lambda: sum(w.protocol_errors for w in setup.workers) >= errors_before + 2,
        5,
        "the refusals counted",
    )


def test_a_broker_that_replays_or_alters_a_sealed_none_fails_the_job(
    make: Callable[[bool], Setup],
) -> None:
    """A job without inputs carries, for its rank, a sealed None that is a tag alone: taken
    from one job into the next (all else the same) or altered, it starts nothing."""
    setup = make(True)
    tap = setup.tap
    kept: list[bytes] = []

    def bindings(msg: Record, sealed: Any) -> Exec:
        assert isinstance(msg, Exec)
        return Exec(msg.session, msg.job, msg.digest, msg.ranks, {0: sealed}, msg.inline,
                    msg.timeout_s)  # fmt: skip

    def replay_none(msg: Record) -> Record | None:
        if isinstance(msg, Exec) and 0 in msg.bindings:
            if not kept:
                kept.append(msg.bindings[0])
                return None
            return bindings(msg, kept[0])
        return None

    def alter_none(msg: Record) -> Record | None:
        if isinstance(msg, Exec) and 0 in msg.bindings:
            return bindings(msg, msg.bindings[0][:-1] + bytes([msg.bindings[0][-1] ^ 1]))
        return None

    with setup.ctx:
        one = mp.device("P0")(lambda: 1)
        tap.alter = replay_none
        assert mp.fetch(one()) == 1
        assert type(kept[0]) is bytes and kept[0].startswith(BOX_MAGIC)
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            one()
        tap.alter = alter_none
        with pytest.raises(mp.AuthenticationError, match="failed authentication"):
            one()
        tap.alter = None  # and the cluster keeps serving honest traffic
        assert mp.fetch(one()) == 1


def test_a_broker_that_replays_a_recorded_exec_thousands_of_jobs_later_runs_nothing(
    make: Callable[[bool], Setup], tmp_path: Path
) -> None:
    """The broker records a job's sealed Exec (code with a side effect), lets more jobs run
    than a worker could remember one by one, then hands the recorded Exec to the worker
    again: the worker refuses it, and the code ran once."""
    setup = make(True)
    tap, worker = setup.tap, setup.workers[0]
    ran = tmp_path / "ran"
    path = str(ran)
    recorded: list[Record] = []

    def record(msg: Record) -> Record | None:
        if isinstance(msg, Exec) and 0 in msg.bindings and not recorded:
            recorded.append(msg)
        return None

    def replay(msg: Record) -> list[Record] | None:
        if isinstance(msg, Exec) and 0 in msg.bindings:
            tap.alter = None
            return [recorded[0], msg]  # the recorded Exec, then the honest one
        return None

    def side_effect() -> int:
        with open(path, "a") as out:
            return out.write("ran\n")

    with setup.ctx:
        tap.alter = record
        assert mp.fetch(mp.device("P0")(side_effect)()) == 4
        tap.alter = None
        one = mp.device("P0")(lambda: 1)
        values = [one() for _ in range(4200)]
        assert mp.fetch(values[-1]) == 1
        errors = worker.protocol_errors
        tap.alter = replay
        assert mp.fetch(one()) == 1
        wait_until(
            lambda: worker.protocol_errors > errors or ran.read_text().count("ran") > 1,
            20,
            "the replay refused or run",
        )
    assert ran.read_text() == "ran\n"
    assert worker.protocol_errors == errors + 1


def test_a_worker_restarted_under_a_running_driver_serves_it_again(
    make: Callable[[bool], Setup], tmp_path: Path
) -> None:
    """A restarted worker knows none of the driver's sequence numbers: the first job on it
    is refused (sealed for the process before it), and the refusal makes the driver number
    its jobs afresh for that node. That job's refusal is its error (it is not sent again:
    ``DriverSeal.refused``); the next ones run."""
    setup = make(True)
    with setup.ctx:
        one = mp.device("P0")(lambda: 1)
        values = [one() for _ in range(4200)]  # past the window of a stream's first numbers
        assert mp.fetch(values[-1]) == 1
        old = setup.workers[0]
        old.stop()
        old.join(5)
        setup.workers[0] = Worker(
            setup.broker.address,
            0,
            curve=setup.curves["node0"],
            data_root=tmp_path / "data0-restarted",
        ).start()
        assert setup.workers[0].joined.wait(15), "worker did not join"
        refusals: list[str] = []
        wait_until(lambda: _ran(one, refusals), 20, "a job on the restarted worker")
        assert len(refusals) == 1 and "does not know" in refusals[0]
        assert mp.fetch(one()) == 1


def _ran(fn: Callable[[], Any], refusals: list[str]) -> bool:
    """Run ``fn`` once on a worker that may still be joining: True once it ran; an
    AuthenticationError is noted in ``refusals``; other failures (the rank not back yet)
    mean try again."""
    try:
        mp.fetch(fn())
    except mp.AuthenticationError as exc:
        refusals.append(str(exc))
        return False
    except mp.MplError:
        return False
    return True
