"""The report: bench/results/report.md, from the numbers of one run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bench import datapath, gpu
from bench.datapath import SizeResult
from bench.footprint import Footprint
from bench.pyspy_profile import ProcessProfile
from bench.stats import DispatchRow
from bench.targets import Target
from bench.where_time_goes import Scenario

CPUS = os.cpu_count() or 1
ADVICE_MIN_SHARE = 0.08  # groups below this share of the daemon's time get no advice line


@dataclass
class RunFacts:
    host: str
    when: str
    command: str
    repeats: int
    versions: str
    load_before: str
    load_after: str = ""
    duration_s: float = 0.0
    charts: list[tuple[str, str]] = field(default_factory=list)  # (file, caption)
    opencl: list[str] = field(default_factory=list)  # bench/opencl.py's section
    ray_executor: list[str] = field(default_factory=list)  # bench/ray_executor.py's section
    cli_start: list[str] = field(default_factory=list)  # bench/cli_start.py's section


def render(
    facts: RunFacts,
    targets: list[Target],
    dispatch: list[DispatchRow],
    breakdown: dict[str, float],
    sizes: list[SizeResult],
    footprint: Footprint | None,
    peer_footprints: dict[str, dict[str, float]],
    scenarios: list[Scenario] | None,
    advice: dict[str, str],
) -> str:
    parts = [
        _header(facts),
        _targets(targets),
        _dispatch(dispatch, breakdown),
        _datapath(sizes),
        _footprint(footprint, peer_footprints),
        "\n".join(["## 4. GPU", "", *gpu.section()]),
        "\n".join(facts.opencl),
        "\n".join(facts.ray_executor),
        "\n".join(facts.cli_start),
        _profile(scenarios, targets, advice),
        _charts(facts.charts),
    ]
    return "\n\n".join(part.rstrip() for part in parts) + "\n"


def _header(facts: RunFacts) -> str:
    return "\n".join([
        "# taogpud beside what users would pick instead",
        "",
        f"Measured {facts.when} on **{facts.host}**, by one run of `{facts.command}` "
        f"({facts.duration_s / 60:.1f} min): every number below comes from that run on that "
        f"host. Each is the median of {facts.repeats} repeats, with the min–max in brackets. "
        "In the dispatch table a repeat is a round: every system runs once a round, in turn, "
        "the order reversed each round, so each meets the same stretches of a shared host.",
        "",
        f"Load average before the run: {facts.load_before}; after: {facts.load_after}. "
        "A busy host lowers every row, not only taogpud's; the ratios hold better than the "
        "absolute numbers.",
        "",
        f"Versions: {facts.versions}.",
    ])  # fmt: skip


def _targets(targets: list[Target]) -> str:
    lines = [
        "## Targets (issue 18)",
        "",
        "Ratio: the measured value against the goal, 1.00× or more is met. A ratio with a "
        "number whose median is more than 2× off its best repeat (most repeats disturbed: a "
        "busy host) bears no verdict: it says so, with the spread.",
        "",
        "| target | measured in this run | ratio to goal | verdict |",
        "|---|---|---:|---|",
    ]
    for target in targets:
        ratio = "—" if target.ratio is None else f"{target.ratio:.2f}×"
        notes = [text for text in (target.note, target.unsettled) if text]
        measured = target.measured + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(f"| {target.goal} | {measured} | {ratio} | **{target.verdict}** |")
    return "\n".join(lines)


def _dispatch(rows: list[DispatchRow], breakdown: dict[str, float]) -> str:
    lines = [
        "## 1. Tiny-job dispatch (submit → result)",
        "",
        "The same tiny job everywhere: taogpud's `noop` task, and a function returning None "
        "for the peers. 1 client submits and waits, job after job; 8 clients are 8 "
        "processes doing the same at once (threads where noted). Every system gets 2 "
        "workers: taogpud's CPU pair (2 devices, 2 slots each), dask's 2 worker processes, "
        "Ray's `num_cpus=2` (2 actors for 8 clients), the executor's 2 processes.",
        "",
        "| system | clients | jobs per repeat | jobs/s | p50 ms | p99 ms | notes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        if row.error or row.jobs_per_s is None or row.p50_ms is None or row.p99_ms is None:
            lines.append(f"| {row.system} | | | — | — | — | not measured: {row.error} |")
            continue
        lines.append(
            f"| {row.system} | {row.clients} | {row.jobs:,} | {row.jobs_per_s.text()} "
            f"| {row.p50_ms.text('.3f')} | {row.p99_ms.text('.3f')} | {row.note} |"
        )
    if breakdown:
        lines += [
            "",
            "Where a sequential taogpud job's time goes, from the daemon's own traces (medians):",
            f"in the API server, request in → response out {breakdown['server_request_ms']:.3f} "
            f"ms; of that, queued before a slot {breakdown['queue_ms']:.3f} ms and the task in "
            f"the worker (order → result) {breakdown['worker_run_ms']:.3f} ms. The rest of the "
            "round trip is the client and the socket.",
        ]
    return "\n".join(lines)


def _datapath(sizes: list[SizeResult]) -> str:
    if not sizes:
        return "## 2. Data path\n\nNot measured."
    header = " | ".join(f"{s.size_mib} MiB, GiB/s" for s in sizes)
    ratios = " | ".join(f"{s.size_mib} MiB vs raw: warm / fresh" for s in sizes)
    lines = [
        "## 2. Data path (arrays in and out)",
        "",
        "A float32 array's .npy image. Uploads from a numpy array send its .npy header and "
        "then the array's own memory; downloads are vector_add's kept output `c` over the "
        "same bytes. Raw socket: the same bytes over AF_UNIX to and from another process, landing "
        "in a warm buffer (the ceiling) or in fresh memory (what an upload fills: a new "
        "/dev/shm file, written from a warm 1 MiB buffer; what a download returns: new "
        "bytes), because filling fresh pages can cost more than the copy itself. The "
        "no-socket row is that filling alone: no upload can land faster.",
        "",
        f"| path | {header} | {ratios} |",
        "|---|" + "---:|" * (2 * len(sizes)),
    ]
    for method in datapath.METHODS:
        cells = [s.gib_per_s[method].text(".2f") for s in sizes]
        versus = datapath.VERSUS.get(method, ())
        shares = [
            " / ".join(f"{s.gib_per_s[method].median / s.gib_per_s[v].median:.0%}" for v in versus)
            for s in sizes
        ]
        lines.append(f"| {method} | {' | '.join(cells)} | {' | '.join(shares)} |")
    return "\n".join(lines)


def _footprint(footprint: Footprint | None, peers: dict[str, dict[str, float]]) -> str:
    lines = [
        "## 3. Footprint",
        "",
        "Start → ready: taogpud from launching `python -m taogpud` to `GET /v1/health` "
        "answering ok (polled every 5 ms; every worker warm). Idle RSS (VmRSS) 1 s after ready.",
        "",
        "| what | start → ready s | idle RSS MiB |",
        "|---|---:|---:|",
    ]
    if footprint is not None:
        lines.append(
            f"| taogpud daemon | {footprint.ready_s.text('.2f')} "
            f"| {footprint.daemon_rss_mib.text('.0f')} |"
        )
        for label, rss in footprint.worker_rss_mib.items():
            lines.append(f"| taogpud worker {label} | | {rss.text('.0f')} |")
    for name, found in peers.items():
        lines.append(
            f"| {name}: every process (driver included) | {found['start_s']:.2f} "
            f"| {found['idle_rss_mib']:.0f} |"
        )
    if peers:
        lines += ["", "Peers: their first dispatch round's start, so no min–max."]
    return "\n".join(lines)


def _profile(
    scenarios: list[Scenario] | None, targets: list[Target], advice: dict[str, str]
) -> str:
    lines = ["## 5. Where the time goes", ""]
    if all(target.verdict == "met" for target in targets):
        return "\n".join([*lines, "Every target was met: no profile taken."])
    if all(target.verdict != "missed" for target in targets):
        return "\n".join(
            [*lines, "No target was missed, but some bore no verdict: no profile taken."]
        )
    if not scenarios:
        return "\n".join(
            [*lines, "A target was missed, but py-spy could not profile (see the log)."]
        )
    lines += [
        "A target was missed, so the daemon was sampled with py-spy (`record -f raw`, "
        "subprocesses included) under three steady loads. Rate and CPU per unit (user + "
        "system time from /proc) come from a window without py-spy, from one finished unit "
        "to another; the shares from a second window with py-spy attached. "
        "Shares are of busy samples: py-spy leaves idle threads out but counts a runnable "
        "thread waiting for a CPU as busy, so on a loaded host they blur; the CPU columns "
        "do not. A C call (SQLite, a socket write, uvloop itself) shows as its Python caller; "
        "`Runner.run` as a leaf is uvloop's own C code, the socket and pipe I/O it does included.",
        "",
        "| load | units in window | units/s | CPU ms per unit: daemon | workers | clients "
        "| ceiling: daemon's loop | ceiling: all CPUs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in scenarios:
        cpu = s.cpu_ms_per_unit
        lines.append(
            f"| {s.name} | {s.units:,} {s.unit}s | {s.units_per_s:,.1f} | {cpu['daemon']:.3f} "
            f"| {cpu['workers']:.3f} | {cpu['clients']:.3f} | {_ceiling(cpu['daemon'])} "
            f"| {_ceiling(sum(cpu.values()) / CPUS)} |"
        )
    lines += [
        "",
        "Ceilings, in units/s: the daemon's event loop is one thread, so it cannot pass "
        "1 / (its CPU per unit); and daemon, workers and clients share this host's "
        f"{CPUS} CPUs, so together they cannot pass {CPUS} / (all their CPU per unit). "
        "A target above a ceiling needs less CPU per unit, not a quieter host.",
    ]
    for s in scenarios:
        lines += ["", f"### {s.name}", ""]
        for who, profile in s.profiles.items():
            lines += _process_profile(
                who, profile, s.cpu_ms_per_unit.get(_cpu_key(who), 0.0), s.unit
            )
    lines += ["", "### What to change, by the numbers above", "", *_advice(scenarios, advice)]
    return "\n".join(lines)


def _ceiling(cpu_ms: float) -> str:
    return f"{1e3 / cpu_ms:,.0f}" if cpu_ms > 0 else "—"


def _cpu_key(who: str) -> str:
    return "clients" if who == "client" else who


def _process_profile(who: str, profile: ProcessProfile, cpu_ms: float, unit: str) -> list[str]:
    lines = [
        f"**{who}** ({profile.samples:,} busy samples{_left_out(profile)}; "
        f"{_micros(cpu_ms * 1e3)} CPU per {unit}):",
        "",
        f"| group (innermost frame wins) | share | ≈ CPU per {unit} |",
        "|---|---:|---:|",
    ]
    for group, share in profile.groups.items():
        lines.append(f"| {group} | {share:.1%} | {_micros(share * cpu_ms * 1e3)} |")
    lines += ["", "| top frames, inclusive | group | share |", "|---|---|---:|"]
    lines += [f"| `{frame}` | {group} | {share:.1%} |" for frame, group, share in profile.top]
    lines += ["", "| hot lines (leaf) | group | share |", "|---|---|---:|"]
    lines += [f"| `{frame}` | {group} | {share:.1%} |" for frame, group, share in profile.hot]
    return [*lines, ""]


def _left_out(profile: ProcessProfile) -> str:
    return (
        f", {profile.left_out:,} of the config watcher's wait left out" if profile.left_out else ""
    )


def _advice(scenarios: list[Scenario], advice: dict[str, str]) -> list[str]:
    """A line per group that takes a real share of some process, where and what it costs."""
    seen: dict[str, dict[str, tuple[float, str]]] = {}  # group → who → (share, text)
    for s in scenarios:
        for who, profile in s.profiles.items():
            cpu_ms = s.cpu_ms_per_unit.get(_cpu_key(who), 0.0)
            for group, share in profile.groups.items():
                best = seen.setdefault(group, {}).get(who, (0.0, ""))
                if share >= ADVICE_MIN_SHARE and share > best[0]:
                    cost = f"≈ {_micros(share * cpu_ms * 1e3)} per {s.unit}"
                    seen[group][who] = (share, f"{share:.0%} of the {who} in *{s.name}* ({cost})")
    # The daemon's groups first, then the workers', then the client's; each by its top share.
    rank = {"daemon": 0, "workers": 1, "client": 2}
    found = [
        (min(rank.get(who, 3) for who in by), -max(v[0] for v in by.values()), g, by)
        for g, by in seen.items()
        if by and g in advice
    ]
    lines = []
    for *_, group, by_who in sorted(found):
        where = "; ".join(text for _, text in by_who.values())
        lines.append(f"- **{group}** — {where}. {advice[group]}")
    return lines or ["No group took more than a small share: the time is spread thin."]


def _micros(value: float) -> str:
    return f"{value:,.0f} µs" if value < 10_000 else f"{value / 1e3:,.0f} ms"


def _charts(charts: list[tuple[str, str]]) -> str:
    if not charts:
        return ""
    lines = ["## Charts", ""]
    for file, caption in charts:
        lines += [f"![{caption}]({file})", ""]
    return "\n".join(lines)
