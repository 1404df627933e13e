"""Keys and trust without daemons: key files, keys in the cluster spec, who may claim a rank,
and which endpoints may run plaintext."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any, cast

import pytest
import zmq
import zmq.auth
from click.testing import CliRunner

from mpl.broker.state import BrokerState
from mpl.wire import ClusterSpec, ClusterSpecError
from mpl.wire.control import Channel, Directory, Refused, Welcome, WorkerHello
from mpl.wire.curve import plaintext_safe
from mpl.wire.errors import KeyFileError
from mpl.wire.keys import is_z85_key, load_keypair, load_public_key, write_keypair
from mpl.wire.keytool import main as mpl_keys


def z85() -> str:
    return zmq.curve_keypair()[0].decode()


def keyed(world: int = 2) -> ClusterSpec:
    return ClusterSpec.simple(world).with_keys(
        z85(), [z85() for _ in range(world)], {"analyst": z85()}
    )


# -- key files --------------------------------------------------------------------------------
def test_mpl_keys_new_writes_zeromq_certificates_and_show_prints_the_public_key(
    tmp_path: Path,
) -> None:
    made = CliRunner().invoke(mpl_keys, ["new", "node0", "--dir", str(tmp_path / "k")])
    assert made.exit_code == 0, made.output
    public = made.stdout.strip()
    assert is_z85_key(public)
    pub_file, sec_file = tmp_path / "k" / "node0.key", tmp_path / "k" / "node0.key_secret"
    # zmq.auth reads what mpl-keys writes
    assert zmq.auth.load_certificate(pub_file) == (public.encode(), None)
    pub, sec = zmq.auth.load_certificate(sec_file)
    assert pub == public.encode() and sec is not None
    assert stat.S_IMODE(sec_file.stat().st_mode) == 0o600
    for f in (pub_file, sec_file):
        shown = CliRunner().invoke(mpl_keys, ["show", str(f)])
        assert shown.exit_code == 0 and shown.stdout.strip() == public
    assert sec.decode() not in CliRunner().invoke(mpl_keys, ["show", str(sec_file)]).output
    again = CliRunner().invoke(mpl_keys, ["new", "node0", "--dir", str(tmp_path / "k")])
    assert again.exit_code != 0 and "already exists" in again.output  # a key is never replaced


def test_key_loading_errors_are_clear(tmp_path: Path) -> None:
    pub_file, sec_file, public = write_keypair(tmp_path, "drv")
    assert load_keypair(sec_file).public == public
    assert load_public_key(pub_file) == public
    assert "hidden" in repr(load_keypair(sec_file))
    with pytest.raises(KeyFileError, match=r"no such key file.*mpl-keys new"):
        load_keypair(tmp_path / "missing.key_secret")
    with pytest.raises(KeyFileError, match="only a public key"):
        load_keypair(pub_file)
    bad = tmp_path / "bad.key_secret"
    bad.write_text('curve\n    public-key = "short"\n    secret-key = "x"\n')
    with pytest.raises(KeyFileError, match="not a 40-character z85"):
        load_keypair(bad)
    other = tmp_path / "mixed.key_secret"  # someone else's public key beside our secret
    other.write_text(sec_file.read_text().replace(public, z85()))
    with pytest.raises(KeyFileError, match="does not belong"):
        load_keypair(other)
    assert issubclass(KeyFileError, ValueError)


# -- keys in the spec ---------------------------------------------------------------------------
def test_keys_round_trip_through_dict_and_yaml() -> None:
    spec = keyed(3)
    assert spec.secure and not ClusterSpec.simple(2).secure
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    assert ClusterSpec.from_yaml(spec.to_yaml()) == spec
    data = spec.to_dict()
    assert data["broker"] == {"curve_key": spec.broker_key}
    assert data["drivers"] == [{"name": "analyst", "curve_key": spec.drivers[0].curve_key}]
    assert [n["curve_key"] for n in data["nodes"]] == [n.curve_key for n in spec.nodes]
    assert "broker" not in ClusterSpec.simple(2).to_dict()  # plaintext specs are unchanged


def _drop_node_key(d: dict[str, Any]) -> None:
    del d["nodes"][1]["curve_key"]


def _bad_key(d: dict[str, Any]) -> None:
    d["broker"]["curve_key"] = "not-a-key"


def _no_drivers(d: dict[str, Any]) -> None:
    del d["drivers"]


def _no_broker(d: dict[str, Any]) -> None:
    del d["broker"]


def _shared_key(d: dict[str, Any]) -> None:
    d["drivers"][0]["curve_key"] = d["nodes"][0]["curve_key"]


def _duplicate_driver(d: dict[str, Any]) -> None:
    d["drivers"].append({"name": "analyst", "curve_key": z85()})


def _driver_without_key(d: dict[str, Any]) -> None:
    d["drivers"][0].pop("curve_key")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop_node_key, r"nodes\[1\]\.curve_key: missing key"),
        (_bad_key, r"broker\.curve_key: expected a 40-character z85"),
        (_no_drivers, r"drivers: missing"),
        (_no_broker, r"broker\.curve_key: missing key"),
        (_shared_key, r"drivers\[0\]\.curve_key: the same key as nodes\[0\]"),
        (_duplicate_driver, r"drivers\[1\]\.name: duplicate driver 'analyst'"),
        (_driver_without_key, r"drivers\[0\]\.curve_key: missing key"),
    ],
)
def test_key_validation_names_the_field(edit: Any, message: str) -> None:
    data = keyed().to_dict()
    edit(data)
    with pytest.raises(ClusterSpecError, match=message):
        ClusterSpec.from_dict(data)


# -- who may claim a rank -------------------------------------------------------------------
def _hello(rank: int, inc: str) -> WorkerHello:
    return WorkerHello(rank, inc, 1, "h", f"tcp://x:{rank}", "")


def test_a_hello_counts_only_from_that_ranks_key_even_first_after_a_restart() -> None:
    spec = keyed()
    state = BrokerState(spec, now=0.0, broker_id="B", secure=True)
    # node1's key claims rank 0 before the genuine worker (e.g. right after a broker restart)
    out = state.handle(b"evil", _hello(0, "stolen"), 0.0, who="node:node1")
    assert [type(a.msg) for a in out] == [Refused]
    assert cast(Refused, out[0].msg).error.kind == "AuthenticationError"
    assert "node:node0" in cast(Refused, out[0].msg).error.message
    assert state.registry.by_rank == {} and state.counters["protocol_errors"] == 1
    assert state.handle(b"anon", _hello(0, "x"), 0.0, who=None)[0].msg.TAG == "refused"
    out = state.handle(b"w0", _hello(0, "inc0"), 0.0, who="node:node0")
    assert isinstance(out[0].msg, Welcome) and state.registry.by_rank[0].peer == b"w0"
    # the incarnation is in every Directory; replaying it from another key gets nothing
    out = state.handle(b"evil", Channel(0, "inc0"), 0.0, who="node:node1")
    assert isinstance(out[0].msg, Refused) and b"evil" not in state.registry.channels
    out = state.handle(b"evil", _hello(0, "inc0"), 0.0, who="driver:analyst")
    assert isinstance(out[0].msg, Refused)
    assert state.registry.by_rank[0].peer == b"w0"
    assert not any(isinstance(a.msg, Directory) for a in out)


def test_plaintext_brokers_keep_accepting_hellos_without_identities() -> None:
    state = BrokerState(ClusterSpec.simple(2), now=0.0, broker_id="B")
    assert isinstance(state.handle(b"w0", _hello(0, "i"), 0.0)[0].msg, Welcome)


# -- where plaintext may listen ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("endpoint", "safe"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.0.3.4:0", True),
        ("tcp://[::1]:5", True),
        ("tcp://localhost:5", True),
        ("inproc://x", True),
        ("127.0.0.1", True),
        ("tcp://0.0.0.0:0", False),
        ("tcp://*:5555", False),
        ("tcp://10.1.2.3:5555", False),
        ("tcp://eth0:5555", False),
        ("0.0.0.0", False),
    ],
)
def test_plaintext_is_safe_only_on_loopback(endpoint: str, safe: bool) -> None:
    assert plaintext_safe(endpoint) is safe


# -- what a peer can send ---------------------------------------------------------------------
def test_sockets_bound_frame_size_and_handshake_time() -> None:
    from helpers import wait_until

    from mpl.wire.sockets import HANDSHAKE_IVL_MS, MAX_MESSAGE, configure

    ctx = zmq.Context()
    pull = configure(ctx.socket(zmq.PULL), max_message=1024)
    push = configure(ctx.socket(zmq.PUSH))
    try:
        assert push.getsockopt(zmq.MAXMSGSIZE) == MAX_MESSAGE
        assert pull.getsockopt(zmq.HANDSHAKE_IVL) == HANDSHAKE_IVL_MS <= 10_000
        pull.bind("tcp://127.0.0.1:0")
        push.connect(pull.getsockopt_string(zmq.LAST_ENDPOINT))
        push.send(b"x" * 2048)  # too big: the receiver drops the connection

        def small() -> bytes | None:
            try:  # the sender reconnects; small frames get through again
                push.send(b"small", zmq.NOBLOCK)
            except zmq.Again:
                return None
            return pull.recv() if pull.poll(100) else None

        assert wait_until(small, what="a small frame") == b"small"  # never the big one
    finally:
        pull.close(0)
        push.close(0)
        ctx.term()


def test_the_gatekeeper_admits_pinned_keys_names_them_and_logs_refusals_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from zmq.utils import z85 as z85_codec

    from mpl.wire.curve import BROKER_DOMAIN, PEER_DOMAIN, broker_admits, peer_admits
    from mpl.wire.zap import Gatekeeper

    spec = keyed()
    ctx = zmq.Context()
    gate = Gatekeeper(ctx, {**broker_admits(spec), **peer_admits(spec)})  # not started
    try:
        node1, driver = spec.nodes[1].curve_key, spec.drivers[0].curve_key
        assert gate.callback(BROKER_DOMAIN, node1.encode())
        assert gate.callback(BROKER_DOMAIN, driver.encode())
        assert gate.callback(PEER_DOMAIN, node1.encode())
        assert not gate.callback(PEER_DOMAIN, driver.encode())  # drivers never reach workers
        assert gate.curve_user_id(z85_codec.decode(node1)) == "node:node1"
        assert gate.curve_user_id(z85_codec.decode(driver)) == "driver:analyst"
        stranger = z85().encode()
        with caplog.at_level("WARNING", logger="mpl.auth"):
            for _ in range(100):
                assert not gate.callback(BROKER_DOMAIN, stranger)
        assert gate.refused == 101
        lines = [r for r in caplog.records if stranger.decode() in r.getMessage()]
        assert len(lines) == 1  # a client retrying its handshake cannot flood the log
    finally:
        ctx.term()
