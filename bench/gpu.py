"""The GPU section: the CUDA backend's GPU check report, when one was written on this host."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def section() -> list[str]:
    reports = sorted(RESULTS.glob("gpu-check.*"))
    if not reports:
        return [
            "No GPU was available: no `bench/results/gpu-check.*` report exists (the CUDA "
            "backend's GPU check writes it on a GPU host), so this run has no GPU numbers. "
            f"NVIDIA device nodes here: {'yes' if Path('/dev/nvidia0').exists() else 'none'}.",
        ]
    lines = []
    for report in reports:
        lines += [f"From `{report.name}` (as the GPU check wrote it):", ""]
        lines += _render(report)
        lines.append("")
    return lines


def _render(report: Path) -> list[str]:
    text = report.read_text()
    if report.suffix == ".json":
        return ["```json", json.dumps(json.loads(text), indent=2), "```"]
    if report.suffix == ".md":
        return text.splitlines()
    return ["```", text.rstrip(), "```"]
