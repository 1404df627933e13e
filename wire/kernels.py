"""Named kernels: a call of a logical op by name, with no code on the wire.

``mp.kernel("io.read_table")`` stands where a function would: the driver puts a
:class:`KernelRef` in the graph's function table instead of a pickled callable, and each
worker resolves the name through its node's ``runtime_info.op_bindings`` (logical op ->
kernel id) to an implementation its operator installed (``mpl.worker.kernel_table``). A
reference is a plain record, so a worker that refuses code (``mpl-worker --code kernels``)
still runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpl.wire.record import Record

__all__ = ["KernelRef"]


@dataclass(eq=False, repr=False)
class KernelRef(Record, tag="kernel"):
    """A logical op, called by name on the worker that runs it."""

    name: str

    @property
    def __name__(self) -> str:  # what op labels and traces show
        return f"kernel {self.name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"kernel {self.name!r} runs on a worker: call it through a device, e.g. "
            f"mp.device('P0')(mp.kernel({self.name!r}))(...)"
        )
