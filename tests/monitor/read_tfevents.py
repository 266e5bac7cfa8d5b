"""Reads dsc's TensorBoard event files with the tensorboard package itself
(its EventFileLoader, which checks the TFRecord CRCs, and EventAccumulator,
what TensorBoard's scalar dashboard uses) and compares the scalars with
what was written.

  read_tfevents.py DIR expected    DIR holds test_monitor's events
  read_tfevents.py DIR csv         DIR/job holds a training run's events and CSV
                                   files; both must hold the same series

Exits 77 (skipped) when the tensorboard package is missing. Run by
tests/monitor/test_monitor.sh.
"""
import csv
import glob
import math
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
except ImportError as e:
    print("skipped: tensorboard package not importable:", e)
    sys.exit(77)

directory, mode = sys.argv[1], sys.argv[2]
job = os.path.join(directory, "job")
files = glob.glob(os.path.join(job, "events.out.tfevents.*"))
assert len(files) == 1, files

records = [event_pb2.Event.FromString(r) for r in RawEventFileLoader(files[0]).Load()]
assert records[0].file_version == "brain.Event:2", records[0]
acc = event_accumulator.EventAccumulator(job)
acc.Reload()
tags = sorted(acc.Tags()["scalars"])
assert tags == ["Train/Samples/lr", "Train/Samples/train_loss"], tags


def series(tag):
    return [(s.step, s.value) for s in acc.Scalars(tag)]


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


if mode == "expected":
    want = {"Train/Samples/train_loss": [(16 * (i + 1), 5.0 / (1 + i)) for i in range(5)],
            "Train/Samples/lr": [(16 * (i + 1), 1e-3 * (i + 1)) for i in range(5)]}
    for tag, rows in want.items():
        got = series(tag)
        assert [s for s, _ in got] == [s for s, _ in rows], (tag, got)
        assert all(close(g, w) for (_, g), (_, w) in zip(got, rows)), (tag, got, rows)
else:
    for tag in tags:
        with open(os.path.join(job, tag.replace("/", "_") + ".csv")) as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["step", tag.split("/")[-1]], rows[0]
        from_csv = [(int(s), float(v)) for s, v in rows[1:]]
        got = series(tag)
        assert [s for s, _ in got] == [s for s, _ in from_csv], (tag, got, from_csv)
        assert all(close(g, w) for (_, g), (_, w) in zip(got, from_csv)), (tag, got, from_csv)
        assert all(math.isfinite(v) for _, v in got)
for tag in tags:
    print(tag, series(tag))
print("tensorboard read", len(records), "records from", os.path.basename(files[0]))
