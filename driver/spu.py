"""SPU devices from the driver's side (filled in by the SPU support)."""

from __future__ import annotations

from typing import Any

from mpl.wire.errors import DeviceError

__all__ = ["fetch", "getitem", "put_host", "reveal", "run", "seal"]


def _unsupported(*args: Any, **kwargs: Any) -> Any:
    raise DeviceError("SPU devices are not supported yet")


run = seal = reveal = put_host = getitem = fetch = _unsupported
