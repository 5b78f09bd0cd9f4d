"""The running batch's slots: one column per running request, kept in order as requests come and go.

The batch is a window of `max_concurrency` columns in buffers three times as wide (the
state rows of `sparksim.step.batch_layout`, and each slot's last emission time), so a
capped step's rotation moves columns into the slack on either side instead of shifting
the whole batch. The engine (`sparksim.sim.engine.Engine`) holds these buffers and calls
these moves; the slot order is DistServe's batch order.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from sparksim.step import kernels
from sparksim.step.batch_layout import NUM_FIELDS


class BatchSlots:
    """The slot window of an engine's running batch: n columns from `_head` in the buffers."""

    max_concurrency: int
    n: int  # running requests: columns 0..n-1 of the window
    state: NDArray[np.int64]  # (NUM_FIELDS, max_concurrency) view of the window
    last_emit: NDArray[np.float64]  # (max_concurrency,) when each slot's request last emitted
    # steps the whole batch may take verifying nothing before a request can finish or run out of
    # trace rows (`Engine._advance_plain`); 0: unknown, measured at the next such step
    _quiet: int = 0

    def _init_slots(self, cap: int) -> None:
        self.n = 0
        self._quiet = 0
        self._state_buf = np.zeros((NUM_FIELDS, 3 * cap), dtype=np.int64)
        # when each slot's request last emitted (ITL after steps it sat out); kept in slot order
        self._emit_buf = np.full(3 * cap, np.nan)
        self._place(cap)

    def _compact(self, keep: NDArray[np.bool_], gone: NDArray[np.intp] | None = None) -> None:
        """Keep the slots where `keep` (n,) is True, in their order; `gone` may list the others."""
        self._quiet = 0
        if gone is None:
            gone = (~keep).nonzero()[0]
        self.n = kernels.compact(self.state, self.last_emit, self.n, gone)

    def _place(self, head: int) -> None:
        """Make the batch the window of the buffers that starts at column `head`."""
        self._head = head
        self.state = self._state_buf[:, head : head + self.max_concurrency]
        self.last_emit = self._emit_buf[head : head + self.max_concurrency]

    def _rotate(self, stepped: int) -> None:
        """Move running slots 0..stepped-1 behind the rest (DistServe's rotation of a capped batch).

        Copies the smaller side, min(stepped, n − stepped) columns, into the buffers' slack and
        moves the window over it; when the slack on that side runs out the window first moves
        back to the middle (n columns, once per `cap` columns rotated at most).
        """
        n, cap, head = self.n, self.max_concurrency, self._head
        self._quiet = 0
        waiting = n - stepped
        if stepped <= waiting:  # the stepped ones go behind the waiting ones
            if head + stepped > 2 * cap:
                head = self._recentre()
            self._state_buf[:, head + n : head + n + stepped] = self._state_buf[:, head : head + stepped]
            self._emit_buf[head + n : head + n + stepped] = self._emit_buf[head : head + stepped]
            self._place(head + stepped)
        else:  # the waiting ones go in front of the stepped ones
            if head < waiting:
                head = self._recentre()
            self._state_buf[:, head - waiting : head] = self._state_buf[:, head + stepped : head + n]
            self._emit_buf[head - waiting : head] = self._emit_buf[head + stepped : head + n]
            self._place(head - waiting)

    def _step_out(self, going_on: NDArray[np.bool_], m: int) -> None:
        """After a capped step: the first m slots stepped; those `going_on` queue behind the
        slots that waited, the rest (finished, already parked) leave the batch.

        The same order as `_compact` then `_rotate`, but copies only the m stepped columns,
        not the whole batch: under the context cap most of a long batch waits.
        """
        cap, head, n = self.max_concurrency, self._head, self.n
        self._quiet = 0
        if head + m > 2 * cap:
            head = self._recentre()
        keep = going_on.nonzero()[0] + head
        self._state_buf[:, head + n : head + n + keep.size] = self._state_buf[:, keep]
        self._emit_buf[head + n : head + n + keep.size] = self._emit_buf[keep]
        self.n = n - m + keep.size
        self._place(head + m)

    def _recentre(self) -> int:
        """Move the batch's n columns to the buffers' middle third; return where it starts."""
        cap, head, n = self.max_concurrency, self._head, self.n
        self._state_buf[:, cap : cap + n] = self._state_buf[:, head : head + n].copy()
        self._emit_buf[cap : cap + n] = self._emit_buf[head : head + n].copy()
        self._place(cap)
        return cap
