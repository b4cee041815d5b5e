"""The on-disk cache of reference and baseline runs (`--cache-dir`/refs/<slug>-<key>/), safe to share.

An entry is trusted only when every file matches the sha256 written beside it when the run was stored: a
truncated, edited or half-written entry is removed (with a warning naming it) and computed again, never judged
against. Runs on one cache at once (`pytest -n 2`, two CI jobs on one runner) compute an entry once: the first
holds the entry's lock while it computes into a private directory and renames it into place; the others wait on
the lock and load what it stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from parity.harness.config.paths import RECORD, RECORD_FILES
from parity.harness.run.records import RunRecord

SUMS = "cache.sha256.json"


def sha256(path: Path) -> str:
    """A file's SHA-256, read in blocks (a record's tensors may be large): the cache's and a golden set's sums."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def problem(directory: Path) -> str | None:
    """Why the entry cannot be trusted (None: every stored file matches its recorded sha256)."""
    try:
        sums = json.loads((directory / SUMS).read_text())
    except FileNotFoundError:
        return f"no {SUMS} (written by an older harness, or the write was cut off)"
    except (OSError, ValueError) as exc:
        return f"{SUMS} unreadable: {exc}"
    for name in RECORD_FILES:
        path = directory / name
        if name not in sums:
            return f"{SUMS} lists no {name}"
        if not path.is_file():
            return f"{path} is missing"
        if sha256(path) != sums[name]:
            return f"{path} does not match its sha256 in {SUMS}"
    return None


def load(directory: Path) -> RunRecord | None:
    """The stored run, or None when there is none or it cannot be trusted (then it is removed, with a warning)."""
    if not directory.exists():
        return None
    why = problem(directory)
    if why is None:
        try:
            return RunRecord.load(directory)
        except (OSError, ValueError, TypeError, KeyError) as exc:  # matching sums, yet not a record
            why = f"not a readable record: {exc}"
    print(f"parity: warning: cached run {directory} cannot be trusted ({why}): computing it again",
          file=sys.stderr, flush=True)
    shutil.rmtree(directory, ignore_errors=True)
    return None


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def differs(stored: RunRecord, again: RunRecord) -> str | None:
    """Where a recomputed run is not the stored one, bit for bit (tensors, every step's loss, grad norms, expert
    load and lr); None when it is."""
    import torch

    if stored.tensors.keys() != again.tensors.keys():
        return f"tensors {sorted(stored.tensors)} vs {sorted(again.tensors)}"
    for name, tensor in stored.tensors.items():
        if not torch.equal(tensor, again.tensors[name]):
            delta = (tensor.double() - again.tensors[name].double()).abs().max().item() \
                if tensor.shape == again.tensors[name].shape else "shape"
            return f"{name} max |Δ| {delta}"
    fields = ("loss", "grad_norm", "group_grad_norms", "expert_load", "lr")
    mine = [tuple(getattr(step, f) for f in fields) for step in stored.steps]
    theirs = [tuple(getattr(step, f) for f in fields) for step in again.steps]
    for index, (a, b) in enumerate(zip(mine, theirs, strict=False)):
        if a != b:
            return f"step {index + 1}: " + ", ".join(f"{f} {x!r} vs {y!r}" for f, x, y in zip(fields, a, b, strict=True)
                                                     if x != y)
    return None if len(mine) == len(theirs) else f"{len(mine)} steps vs {len(theirs)}"


def remove(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def get_or_compute(directory: Path, compute: Callable[[Path], RunRecord],
                   unstorable: Callable[[], str | None] = lambda: None) -> RunRecord:
    """The entry at `directory`, computed by `compute(private_dir)` if it is absent or untrustworthy. A failed
    run is returned, not stored; nor is one when `unstorable()` gives a reason (the code it ran may not be the code
    its key names)."""
    record = load(directory)
    if record is not None:
        return record
    with locked(directory):
        record = load(directory)  # another process may have stored it while this one waited
        if record is not None:
            return record
        private = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
        shutil.rmtree(private, ignore_errors=True)
        record = compute(private)
        why = unstorable() if record.ok else None
        if why is not None:
            print(f"parity: warning: {directory.name} not cached: {why}", file=sys.stderr, flush=True)
        if record.ok and why is None:
            if not (private / RECORD).is_file():  # the record the caller got was not saved there
                record.save(private)
            sums = {name: sha256(private / name) for name in RECORD_FILES if (private / name).is_file()}
            (private / SUMS).write_text(json.dumps(sums, indent=1))
            shutil.rmtree(directory, ignore_errors=True)
            private.rename(directory)
        else:
            shutil.rmtree(private, ignore_errors=True)
        return record
