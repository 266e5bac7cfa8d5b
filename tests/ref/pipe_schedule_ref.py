#!/usr/bin/env python3
"""Independent oracle for DeepSpeed's pipeline schedules (standard library only).

Restated from the event-time formulas in /work/shared/reference/pipe.md
(sections 2-4), not from DeepSpeed's code and not from dsc's C code: every
micro-batch contributes instructions at closed-form steps, and instructions
that share a step are ordered by a fixed priority. GPipe and interleaved 1F1B
are restated from the rules in docs/schedules.md ("GPipe and interleaved
1F1B": the closed-form step grid, messages in the consumer's step, the order
inside a step by edge colour, lowest-free-slot buffers), not from
pipe/schedule_timeline.c.

    pipe_schedule_ref.py train|infer|dp|gpipe M P S   print one stage's stream
    pipe_schedule_ref.py interleaved M P S V          the same with V chunks per stage
    pipe_schedule_ref.py golden DIR                   write the goldens dsc's tests compare against
    pipe_schedule_ref.py compare APP                  compare APP (dsc-schedule) on every case M <= 12, P <= 8
                                                      (interleaved: V in 2, 3 and M a multiple of P)

Output: one line per step, "step <t>:" then " Name(buf=<b>)" per buffer
instruction and " Name()" per batch-end instruction (the dsc-schedule format).
"""
import os
import subprocess
import sys

# Within one training step: the forward side communicates (SendGrad, then
# RecvActivation), the backward side (RecvGrad, then SendActivation); then
# load, then compute, then the batch-end trio.
TRAIN_PRIORITY = ["SendGrad", "RecvActivation", "RecvGrad", "SendActivation", "LoadMicroBatch",
                  "ForwardPass", "BackwardPass", "ReduceTiedGrads", "ReduceGrads", "OptimizerStep"]


def train(M, P, s):
    T = 2 * (M + P - 1)
    nbuf = max(2, min(P - s, M))
    events = []  # (step, name, buffer or None)
    for m in range(M):
        b = m % nbuf
        fwd, bwd = 2 * m + s, 2 * m + 2 * P - 1 - s
        if s > 0:
            events.append((fwd, "RecvActivation", b))
        if s == 0 or s == P - 1:
            events.append((fwd, "LoadMicroBatch", b))
        events.append((fwd, "ForwardPass", b))
        if s < P - 1:
            events.append((fwd + 1, "SendActivation", b))
            events.append((bwd, "RecvGrad", b))
        events.append((bwd, "BackwardPass", b))
        if s > 0:
            events.append((bwd + 1, "SendGrad", b))
    for name in ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep"):
        events.append((T - 1, name, None))
    events.sort(key=lambda e: (e[0], TRAIN_PRIORITY.index(e[1])))
    return T, events


def infer(M, P, s):
    T = M + P - 1
    # Even stages send before they receive, odd stages the other way round.
    comm = ["SendActivation", "RecvActivation"] if s % 2 == 0 else ["RecvActivation", "SendActivation"]
    priority = ["LoadMicroBatch"] + comm + ["ForwardPass"]
    events = []
    for m in range(M):
        b = m % 2
        if s == 0 or s == P - 1:
            events.append((m + s, "LoadMicroBatch", b))
        if s > 0:
            events.append((m + s, "RecvActivation", b))
        events.append((m + s, "ForwardPass", b))
        if s < P - 1:
            events.append((m + s + 1, "SendActivation", b))
    events.sort(key=lambda e: (e[0], priority.index(e[1])))
    return T, events


def dp(M, P, s):
    events = []
    for m in range(M):
        events += [(m, "LoadMicroBatch", 0), (m, "ForwardPass", 0), (m, "BackwardPass", 0)]
    events += [(M - 1, "ReduceGrads", None), (M - 1, "OptimizerStep", None)]
    return M, events


def timeline(M, P, s, v, interleaved):
    """GPipe (v = 1) or interleaved 1F1B on rank s: (steps, events), events in stream order."""
    V = P * v

    def fwd_step(m, j):
        r, c = j % P, j // P
        if not interleaved:
            return m + j
        k = (m // P) * P * v + c * P + m % P
        return k + r

    def bwd_step(m, j):
        r, c = j % P, j // P
        if not interleaved:
            return (M + P - 1) + m + (P - 1 - j)
        i = (m // P) * P * v + (v - 1 - c) * P + m % P
        return 2 * (P - r - 1) + (v - 1) * P + i + r

    def colour(e):
        return 2 if P % 2 == 1 and e == P - 1 else e % 2

    # (step, rank within step, name, (m, c)); rank: messages by (colour, edge,
    # gradient first), then load, forward, backward.
    ops = []
    left, right = (s - 1) % P, s  # edges to the previous and the next rank
    for m in range(M):
        for c in range(v):
            j = c * P + s
            f, b = fwd_step(m, j), bwd_step(m, j)
            key = (m, c)
            if j > 0:
                ops.append((f, (0, colour(left), left, 1), "RecvActivation", key))
                ops.append((bwd_step(m, j - 1), (0, colour(left), left, 0), "SendGrad", key))
            if j < V - 1:
                ops.append((fwd_step(m, j + 1), (0, colour(right), right, 1), "SendActivation", key))
                ops.append((b, (0, colour(right), right, 0), "RecvGrad", key))
            if j == 0 or j == V - 1:
                ops.append((f, (1,), "LoadMicroBatch", key))
            ops.append((f, (2,), "ForwardPass", key))
            ops.append((b, (3,), "BackwardPass", key))
    ops.sort(key=lambda o: (o[0], o[1]))
    T = 2 * (M + P - 1) if not interleaved else v * M + (v + 1) * P - 2
    last = {}
    for i, o in enumerate(ops):
        last[o[3]] = i
    slots, free, events = {}, [], []
    used = 0
    for i, (t, _, name, key) in enumerate(ops):
        if key not in slots:
            if free:
                free.sort()
                slots[key] = free.pop(0)
            else:
                slots[key] = used
                used += 1
        events.append((t, name, slots[key]))
        if last[key] == i:
            free.append(slots[key])
    for name in ("ReduceTiedGrads", "ReduceGrads", "OptimizerStep"):
        events.append((T - 1, name, None))
    return T, events


def gpipe(M, P, s):
    return timeline(M, P, s, 1, False)


def interleaved(M, P, s, v):
    return timeline(M, P, s, v, True)


def render(T, events):
    lines = []
    for t in range(T):
        parts = ["step %d:" % t]
        for step, name, b in events:
            if step == t:
                parts.append("%s()" % name if b is None else "%s(buf=%d)" % (name, b))
        lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


KINDS = {"train": train, "infer": infer, "dp": dp, "gpipe": gpipe}

# The cases whose streams dsc checks literally.
GOLDEN_CASES = [("train", 4, 2, 0), ("train", 4, 3, 1), ("train", 1, 1, 0), ("train", 8, 4, 3),
                ("train", 8, 4, 0), ("train", 2, 5, 2), ("infer", 4, 3, 0), ("infer", 4, 3, 1),
                ("infer", 4, 3, 2), ("infer", 1, 1, 0), ("dp", 3, 1, 0), ("gpipe", 3, 2, 1), ("gpipe", 4, 3, 0),
                ("gpipe", 4, 3, 2), ("gpipe", 1, 1, 0)]
# Interleaved cases (M, P, S, V), files interleaved_M_P_S_vV.txt.
INTERLEAVED_CASES = [(4, 2, 0, 2), (4, 2, 1, 2), (8, 4, 0, 2), (8, 4, 3, 2), (6, 3, 1, 3), (6, 3, 2, 2)]


def compare(app):
    cases = differ = 0
    runs = []
    for kind in ("train", "infer", "dp", "gpipe"):
        for M in range(1, 13):
            for P in range(1, 9) if kind != "dp" else (1,):
                for s in range(P):
                    runs.append(([kind, str(M), str(P), str(s)], KINDS[kind](M, P, s)))
    for v in (2, 3):
        for P in range(2, 9):
            for M in range(P, 13, P):
                for s in range(P):
                    runs.append((["interleaved", str(M), str(P), str(s), "--v", str(v)], interleaved(M, P, s, v)))
    for args, stream in runs:
        want = render(*stream)
        got = subprocess.run([app] + args, capture_output=True, text=True).stdout
        cases += 1
        if got != want:
            differ += 1
            print("differs: %s" % " ".join(args))
    print("%d cases, %d differ" % (cases, differ))
    return 1 if differ else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "compare":
        return compare(argv[2])
    if len(argv) == 3 and argv[1] == "golden":
        for kind, M, P, s in GOLDEN_CASES:
            path = os.path.join(argv[2], "%s_%d_%d_%d.txt" % (kind, M, P, s))
            with open(path, "w") as f:
                f.write(render(*KINDS[kind](M, P, s)))
        for M, P, s, v in INTERLEAVED_CASES:
            path = os.path.join(argv[2], "interleaved_%d_%d_%d_v%d.txt" % (M, P, s, v))
            with open(path, "w") as f:
                f.write(render(*interleaved(M, P, s, v)))
        return 0
    if len(argv) == 6 and argv[1] == "interleaved":
        M, P, s, v = (int(x) for x in argv[2:])
        if P < 1 or v < 2 or M % P or not 0 <= s < P:
            sys.stderr.write("need P >= 1, V >= 2, M a multiple of P, 0 <= S < P\n")
            return 2
        sys.stdout.write(render(*interleaved(M, P, s, v)))
        return 0
    if len(argv) != 5 or argv[1] not in KINDS:
        sys.stderr.write(__doc__)
        return 2
    M, P, s = int(argv[2]), int(argv[3]), int(argv[4])
    if M < 1 or P < 1 or not 0 <= s < P:
        sys.stderr.write("need M >= 1, P >= 1, 0 <= S < P\n")
        return 2
    sys.stdout.write(render(*KINDS[argv[1]](M, P, s)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
