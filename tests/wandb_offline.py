"""Offline W&B runs read back from their ``.wandb`` files with wandb's own protobuf records (no service, no network)."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def wandb_runs(directory: Path) -> list[dict]:
    """The offline W&B runs directly under ``directory/wandb``: group, job type, name, tags, the metric names its
    history logged and its summary, read from each run's ``.wandb`` file (LevelDB-style log blocks of wandb's
    protobuf ``Record``s). This process's wandb service is shut down first: ``finish()`` returns before the service
    has written the file (measured: 2 of 12 offline runs still had an empty file right after it), and shutting it
    down waits for every file it has open."""
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()

    block, header = 32768, 7
    runs = []
    for path in sorted(directory.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, buffer = path.read_bytes(), 7, b""  # after the file header (":W&B", magic, version)
        run: dict = {"summary": {}, "history": set()}
        while pos + header <= len(data):
            if block - pos % block < header:  # a block's tail too short for a header is padding
                pos += block - pos % block
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
            chunk, pos = data[pos + header : pos + header + length], pos + header + length
            buffer = chunk if kind in (1, 2) else buffer + chunk  # full / first; middle and last append
            if kind not in (1, 4):
                continue
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buffer)
            if record.WhichOneof("record_type") == "run":
                found = record.run
                run |= {"group": found.run_group, "job_type": found.job_type, "name": found.display_name}
                run["tags"] = set(found.tags)
            elif record.WhichOneof("record_type") == "history":
                run["history"] |= {i.key or "/".join(i.nested_key) for i in record.history.item}
            elif record.WhichOneof("record_type") == "summary":
                run["summary"] |= {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update
                }
        runs.append(run)
    return runs
