"""The running batch's layout: one row of `Engine.state` (int64) per field, one column per slot.

Slots 0..n-1 hold the running requests. ROW, EMITTED and CONTEXT are adjacent so one
slice advances all three by the emitted tokens, and STEPS follows them so a step that
verifies no draft (one token each, one step each) advances all four in one. ROW_END and
OUT_LEN are adjacent, in the order of ROW and EMITTED, so one subtraction of two rows from
two gives the steps each request has left before it runs past its trace rows or finishes.
The engine and the compiled step kernel (`sparksim.step.kernels.advance`) both index the
state by these names.
"""

from __future__ import annotations

ROW = 0  # next trace row to replay
EMITTED = 1  # output tokens emitted so far
CONTEXT = 2  # KV tokens held: prompt + emitted
STEPS = 3  # decode steps taken
VERIFIED = 4  # drafts verified so far
ACCEPTED = 5  # drafts accepted so far (after the output-length cut)
RID = 6  # engine-wide request id
ROW_END = 7  # end of the current trace request's rows
OUT_LEN = 8  # output tokens the request will emit in all
DOM = 9  # domain index
TRACE_CUR = 10  # which trace request it replays
ADMIT_SEQ = 11  # first admission's order (preemption takes the newest)
JOINED = 12  # 1 until its first step in the batch: its gap (ITL) runs from before it joined
NUM_FIELDS = 13
