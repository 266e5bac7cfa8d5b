#!/usr/bin/env python3
"""Independent oracle for DeepSpeed's pipeline schedules (standard library only).

Restated from the event-time formulas in /work/shared/reference/pipe.md
(sections 2-4), not from DeepSpeed's code and not from dsc's C code: every
micro-batch contributes instructions at closed-form steps, and instructions
that share a step are ordered by a fixed priority.

    pipe_schedule_ref.py train|infer|dp M P S     print one stage's stream
    pipe_schedule_ref.py golden DIR               write the goldens dsc's tests compare against
    pipe_schedule_ref.py compare APP              compare APP (dsc-schedule) on every case M <= 12, P <= 8

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


def render(T, events):
    lines = []
    for t in range(T):
        parts = ["step %d:" % t]
        for step, name, b in events:
            if step == t:
                parts.append("%s()" % name if b is None else "%s(buf=%d)" % (name, b))
        lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


KINDS = {"train": train, "infer": infer, "dp": dp}

# The cases whose streams dsc checks literally.
GOLDEN_CASES = [("train", 4, 2, 0), ("train", 4, 3, 1), ("train", 1, 1, 0), ("train", 8, 4, 3),
                ("train", 8, 4, 0), ("train", 2, 5, 2), ("infer", 4, 3, 0), ("infer", 4, 3, 1),
                ("infer", 4, 3, 2), ("infer", 1, 1, 0), ("dp", 3, 1, 0)]


def compare(app):
    cases = differ = 0
    for kind in ("train", "infer", "dp"):
        for M in range(1, 13):
            for P in range(1, 9) if kind != "dp" else (1,):
                for s in range(P):
                    want = render(*KINDS[kind](M, P, s))
                    got = subprocess.run([app, kind, str(M), str(P), str(s)], capture_output=True, text=True).stdout
                    cases += 1
                    if got != want:
                        differ += 1
                        print("differs: %s %d %d %d" % (kind, M, P, s))
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
