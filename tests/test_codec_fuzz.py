"""Bad input: decode raises ProtocolError and nothing else, and never hangs."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pytest
from helpers import mutated

from mpl.wire import ProtocolError, Record, decode, encode
from mpl.wire.codec import MAGIC, MAGIC_FRAME, MAX_HEADER_BYTES, from_wire, to_wire
from mpl.wire.control import Heartbeat, WorkerHello
from mpl.wire.jobs import Exec, Lit


@dataclass(eq=False, repr=False)
class Pair(Record, tag="test.pair"):
    n: int
    items: list[str]


def rejects(frames: list[Any], match: str = "") -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(frames)


def test_named_bad_inputs() -> None:
    good = encode(Pair(1, ["a"]))
    rejects([], "at least 2 frames")
    rejects([b"XYZ\x01", good[1]], "bad magic")
    rejects([MAGIC + b"\x09", good[1]], "version 9")
    rejects([MAGIC_FRAME, good[1][:-2]], "malformed header")
    rejects([MAGIC_FRAME, b"\xc1\xc1\xc1"], "malformed header")
    rejects([MAGIC_FRAME, msgpack.packb(["no.such.tag", 1])], "unknown message tag")
    rejects([MAGIC_FRAME, msgpack.packb(["test.pair", 1])], "needs 2 fields")
    rejects([MAGIC_FRAME, msgpack.packb(["test.pair", 1, ["a"], 3])], "needs 2 fields")
    rejects([MAGIC_FRAME, msgpack.packb(["test.pair", "1", ["a"]])], "field 'n'")
    rejects([MAGIC_FRAME, msgpack.packb(["test.pair", 1, [2]])], "field 'items'")
    rejects([*good, b"extra"], "not referenced")
    rejects([MAGIC_FRAME, b"\x00" * (MAX_HEADER_BYTES + 1)], "exceeds")
    arr = encode(Pair(1, ["a"]).__class__(1, ["a"]))
    assert decode(arr) == Pair(1, ["a"])


def test_missing_and_wrong_buffer_frames() -> None:
    frames = encode(Exec("s", "j", "d", (0,), {0: [Lit(np.arange(10))]}))
    rejects(frames[:2], "buffer 0")
    short = [*frames[:2], frames[2][:-8] if isinstance(frames[2], bytes) else bytes(frames[2])[:-8]]
    rejects(short, "array buffer holds")


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = [bytes(f) for f in frames]
    choice = rng.randrange(6)
    if choice == 0 and len(frames) > 2:
        del frames[rng.randrange(2, len(frames))]
    elif choice == 1:
        frames.append(rng.randbytes(rng.randrange(0, 16)))
    elif choice == 2:
        i = rng.randrange(len(frames))
        f = bytearray(frames[i])
        for _ in range(rng.randrange(1, 4)):
            if f:
                f[rng.randrange(len(f))] = rng.randrange(256)
        frames[i] = bytes(f)
    elif choice == 3:
        i = rng.randrange(len(frames))
        frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)]
    elif choice == 4:
        frames[1] = msgpack.packb(
            [rng.choice(["hb", "exec", "hello", "move"]), *[rng.randrange(9)] * rng.randrange(9)]
        )
    else:
        frames = [rng.randbytes(rng.randrange(0, 40)) for _ in range(rng.randrange(0, 5))]
    return frames


SAMPLES = [
    encode(Heartbeat({"objects": 3})),
    encode(WorkerHello(0, "inc", 1, "h", "tcp://x", "")),
    encode(Exec("s", "j", "d", (0, 1), {0: ["u", Lit(np.ones((3, 3)))], 1: [None, Lit((1, "x"))]})),
    encode(Pair(5, ["x", "y"])),
]


@pytest.mark.timeout(60)
def test_fuzz_mutated_wire_frames_only_raise_protocol_error() -> None:
    """The same on the wire's form (wire version 4: magic and header one frame), read as
    every receiver reads it (``from_wire``, then ``decode``)."""
    for sample in SAMPLES:  # unmutated, each reads back: its magic and header one frame
        one = [MAGIC_FRAME + bytes(sample[1]), *sample[2:]]
        assert encode(decode(from_wire(one)))[1] == sample[1]
    rng = random.Random(4321)
    decoded = 0
    for i in range(3000):
        frames = [bytes(memoryview(f)) for f in to_wire(SAMPLES[i % len(SAMPLES)])]
        kind = rng.randrange(3)
        if kind == 0:  # a byte of the first frame changed, a bit flipped, cut, or inserted
            frames[0] = mutated(frames[0], rng)
        elif kind == 1 and len(frames) > 1:
            del frames[rng.randrange(1, len(frames))]
        elif kind == 1:
            frames.append(rng.randbytes(rng.randrange(16)))
        else:  # the first frame cut anywhere, to nothing or to part of the magic included
            frames[0] = frames[0][: rng.randrange(len(frames[0]) + 1)]
        try:
            decode(from_wire(frames))
            decoded += 1
        except ProtocolError:
            pass
    assert decoded < 3000


@pytest.mark.timeout(60)
def test_fuzz_random_and_mutated_frames_only_raise_protocol_error() -> None:
    rng = random.Random(1234)
    decoded = 0
    for i in range(3000):
        base = [bytes(memoryview(f)) for f in SAMPLES[i % len(SAMPLES)]]
        frames = mutate(rng, base)
        try:
            decode(frames)
            decoded += 1
        except ProtocolError:
            pass
    assert decoded < 3000  # most mutations must have been caught
