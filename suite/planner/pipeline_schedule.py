"""A pipeline step played out op by op: each stage's forwards, backwards, sends and receives in
the order torch's schedule issues them (``ScheduleGPipe``, ``Schedule1F1B``), and the step's
length where each rank has a core or a device of its own (``simulate``).

Why not a formula: what a message costs a step depends on when its receive is posted, not only
on how long it takes. gloo (as NCCL) moves a point-to-point message once both sides have posted
it: a send posted early waits for its receive. GPipe posts each receive just before the chunk
that needs it, one at a time, so every message's latency lies on its receiver's path; 1F1B
fuses a stage's next receive with its last send, and overlaps them with its neighbour's work.
So GPipe steps measurably slower than 1F1B over the same stage compute, where the bubble formula
gives both the same (benchmarks/results/code-rules.md).

The rule per message (a rendezvous): its receive's notice reaches the sender ``notice_s``
after the receive is posted; the data leaves once the notice has come and the send is posted,
and completes ``latency_s`` later on both sides. A stage waits on its ops in torch's order; a
send it does not wait on at once runs while it computes. With no latency and balanced stages
the step is the textbook (M + K - 1) chunks."""
from __future__ import annotations

from suite.planner import alpha_beta

SCHEDULES = ("gpipe", "1f1b")
# What the time model predicts through ``simulate``. 1F1B's step is simulated but not predicted
# so: its fused sends and receives in the steady phase cost less than a rendezvous each, so the
# rule over-prices it as chunks grow, where it holds GPipe (benchmarks/results/code-rules.md).
# The bubble formula predicts 1F1B (``suite.planner.timing``).
PREDICTED = ("gpipe",)
PLAYS = 5  # at most (``simulate``): a message found to leave during its sender's compute moves the spans after it


def _gpipe(stage: int, stages: int, chunks: int) -> list[tuple]:
    """ScheduleGPipe's ops on one stage: ("post", handle, [messages]), ("wait", [handles]),
    ("f" | "b", chunk). A message is (direction "F"/"B", chunk, sender stage, receiver stage)."""
    ops, later, first, last = [], [], stage == 0, stage == stages - 1
    for i in range(chunks):
        if not first:
            ops += [("post", ("rf", i), [("F", i, stage - 1, stage)]), ("wait", [("rf", i)])]
        ops.append(("f", i))
        if not last:
            ops.append(("post", ("sf", i), [("F", i, stage, stage + 1)]))
            later.append(("sf", i))
    ops.append(("wait", later))
    later = []
    for i in range(chunks):
        if not last:
            ops += [("post", ("rb", i), [("B", i, stage + 1, stage)]), ("wait", [("rb", i)])]
        ops.append(("b", i))
        if not first:
            ops.append(("post", ("sb", i), [("B", i, stage, stage - 1)]))
            later.append(("sb", i))
    return ops + [("wait", later)]


def _one_f_one_b(stage: int, stages: int, chunks: int) -> list[tuple]:
    """Schedule1F1B's ops on one stage (same form as ``_gpipe``): ``stages - stage`` warm-up
    forwards, whose last send is fused with the first backward's receive, then a backward and a
    forward at a time, each send fused with the next receive, then the remaining backwards."""
    first, last = stage == 0, stage == stages - 1
    fwd_recv = lambda i: [] if first else [("F", i, stage - 1, stage)]  # noqa: E731
    fwd_send = lambda i: [] if last else [("F", i, stage, stage + 1)]  # noqa: E731
    bwd_recv = lambda i: [] if last else [("B", i, stage + 1, stage)]  # noqa: E731
    bwd_send = lambda i: [] if first else [("B", i, stage, stage - 1)]  # noqa: E731
    ops, n = [], 0

    def post_wait(messages):
        nonlocal n
        n += 1
        return [("post", n, messages), ("wait", [n])] if messages else []

    def post(messages):
        nonlocal n
        n += 1
        return [("post", n, messages)] if messages else [], [n] if messages else []

    warmup, fwd, bwd, pending, sends = min(chunks, stages - stage), 0, 0, [], []
    for _ in range(warmup):
        ops += post_wait(fwd_recv(fwd))
        ops.append(("f", fwd))
        ops.append(("wait", pending))
        sends, pending = fwd_send(fwd), []
        if fwd != warmup - 1:
            posted, pending = post(sends)
            ops += posted
        fwd += 1
    while True:
        ops += post_wait(sends + bwd_recv(bwd))
        ops.append(("b", bwd))
        sends = bwd_send(bwd)
        bwd += 1
        if fwd == chunks:
            break
        ops += post_wait(sends + fwd_recv(fwd))
        ops.append(("f", fwd))
        sends = fwd_send(fwd)
        fwd += 1
    posted, pending = post(sends)
    ops += posted
    while bwd < chunks:
        ops += post_wait(bwd_recv(bwd))
        ops.append(("b", bwd))
        ops.append(("wait", pending))
        posted, pending = post(bwd_send(bwd))
        ops += posted
        bwd += 1
    return ops + [("wait", pending)]


def simulate(schedule: str, forward_s: list[float], backward_s: list[float], chunks: int,
             latency_s: float, notice_s: float | None = None, busy_latency_s: float | None = None) -> dict:
    """{"step_s": the last stage's end, "stage_end_s", "stage_busy_s", "messages"} for one step
    of ``schedule`` over ``len(forward_s)`` stages, each rank on a core or device of its own.
    ``forward_s``/``backward_s``: a chunk's forward and backward on each stage; ``latency_s``:
    a message's data one way between neighbours; ``notice_s``: a receive's notice to the sender
    (no data; default ``latency_s``); ``busy_latency_s``: the data's time where it leaves while
    its sender computes (default ``latency_s``). Which messages do is known only once the step
    is played out: it is played again with the last play's compute spans until they hold."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: simulated are {', '.join(SCHEDULES)}")
    out = _play(schedule, forward_s, backward_s, chunks, latency_s, notice_s, None, None)
    for _ in range(PLAYS if busy_latency_s is not None else 0):
        again = _play(schedule, forward_s, backward_s, chunks, latency_s, notice_s, busy_latency_s, out["computing"])
        if again["computing"] == out["computing"]:
            return again
        out = again
    return out


def _play(schedule, forward_s, backward_s, chunks, latency_s, notice_s, busy_latency_s, computing) -> dict:
    """One play of ``simulate``'s step; ``computing``: each stage's compute spans from the last
    play, by which a message's data is priced at ``busy_latency_s`` (None: ``latency_s`` always)."""
    stages = len(forward_s)
    build = _gpipe if schedule == "gpipe" else _one_f_one_b
    programs = [build(s, stages, chunks) for s in range(stages)]
    clock, pc = [0.0] * stages, [0] * stages
    posted: dict = {}  # (message, side "send"/"recv") -> when posted
    handles: list[dict] = [{} for _ in range(stages)]  # handle -> its messages
    spans: list[list] = [[] for _ in range(stages)]  # each stage's compute, (start, end)
    messages, notice = 0, latency_s if notice_s is None else notice_s

    def data_s(sender: int, leaves: float) -> float:
        busy = computing is not None and any(a < leaves < b for a, b in computing[sender])
        return busy_latency_s if busy else latency_s

    def done_at(stage: int, handle) -> float | None:
        """When the handle's messages complete, or None while a peer has not posted its side."""
        end = 0.0
        for message in handles[stage][handle]:
            here = "send" if message[2] == stage else "recv"
            there = posted.get((message, "recv" if here == "send" else "send"))
            if there is None:
                return None
            sent, ready = (posted[(message, here)], there) if here == "send" else (there, posted[(message, here)])
            leaves = max(sent, ready + notice)
            end = max(end, leaves + data_s(message[2], leaves))
        return end

    while any(pc[s] < len(programs[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while pc[s] < len(programs[s]):
                op = programs[s][pc[s]]
                if op[0] == "post":
                    handles[s][op[1]] = op[2]
                    for message in op[2]:
                        posted[(message, "send" if message[2] == s else "recv")] = clock[s]
                        messages += message[2] == s
                elif op[0] == "wait":
                    ends = [done_at(s, h) for h in op[1]]
                    if any(e is None for e in ends):
                        break
                    clock[s] = max([clock[s], *ends])
                else:
                    start, clock[s] = clock[s], clock[s] + (forward_s if op[0] == "f" else backward_s)[s]
                    spans[s].append((start, clock[s]))
                pc[s] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"{schedule} with {stages} stages and {chunks} chunks deadlocked in simulation")
    busy = [chunks * (f + b) for f, b in zip(forward_s, backward_s)]
    return {"step_s": max(clock), "stage_end_s": clock, "stage_busy_s": busy, "messages": messages, "computing": spans}


def predicted_step(schedule: str, stage_steps: list[float], chunks: int, backward_share: float, fit: dict,
                   message_bytes: float) -> dict:
    """``simulate`` for a prediction: each stage's step (``stage_steps``) cut into ``chunks``
    chunks, a chunk's backward ``backward_share`` of it, and its messages priced from the send's
    fit over their link (``fit``: alpha, beta and the calibration's in-step curve).

    A message's notice, a call with no data from a rank that waits, costs the fit's alpha (timed
    after a barrier); its data what a send costs between the calibration's shortest slices of
    compute (``alpha_beta.step_alpha`` at 0), plus its bytes over the bandwidth, or, where it
    leaves while its sender computes, what a send costs between slices as long as the busiest
    stage's compute over its sends and receives (on a CPU the sender's communication thread waits
    for the core its compute holds; both ranks compute while messages move between balanced
    stages). The alternatives tried, and the stored runs that chose this one:
    benchmarks/results/code-rules.md."""
    notice_s = fit["alpha_s"]
    data = message_bytes / alpha_beta.beta_at(fit, "send", message_bytes)
    latency_s = alpha_beta.step_alpha(fit, 0.0) + data
    busy_s = alpha_beta.step_alpha(fit, max(stage_steps) / (2 * chunks)) + data
    return simulate(schedule, [t / chunks * (1 - backward_share) for t in stage_steps],
                    [t / chunks * backward_share for t in stage_steps], chunks, latency_s, notice_s, busy_s)
