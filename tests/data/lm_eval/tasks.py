"""The documents of the offline lm-eval test tasks: rows of depthbench_tiny.jsonl beside this file (no hub, no
cache)."""

import json
from pathlib import Path

import datasets


def load_docs(**kwargs) -> datasets.DatasetDict:
    "lm-eval's `custom_dataset` hook: the JSONL next to this file as a one-split DatasetDict."
    rows = [
        json.loads(line)
        for line in (Path(__file__).parent / "depthbench_tiny.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return datasets.DatasetDict(test=datasets.Dataset.from_list(rows))
