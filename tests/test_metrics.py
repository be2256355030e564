"""The charts people draw (issue 23.6): queue and run time histograms by task, backend and
fallback, read through the daemon's real /metrics; and the Grafana dashboard's every query
naming only what a live scrape holds."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from taogpud.testing import DaemonHandle, InProcessDaemon

DASHBOARD = Path(__file__).resolve().parent.parent / "packaging" / "grafana" / "taogpud.json"
SLEEP_MS = 300
# Labels Prometheus adds at scrape (instance, job) and the histograms' bucket bound.
SCRAPE_LABELS = {"instance", "job", "le"}
# PromQL's own words in a query: functions, aggregations, keywords; all else is a metric name.
PROMQL_WORDS = {"sum", "max", "rate", "increase", "histogram_quantile", "by", "le"}


def scrape(daemon: DaemonHandle) -> dict[str, list[tuple[dict[str, str], float]]]:
    """GET /metrics on the daemon's socket: {sample name: [(labels, value)]}."""
    transport = httpx.HTTPTransport(uds=str(daemon.socket_path))
    with httpx.Client(transport=transport, base_url="http://taogpud") as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def series(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> list[tuple[dict[str, str], float]]:
    return [(got, value) for got, value in samples.get(name, []) if labels.items() <= got.items()]


def buckets(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> list[tuple[float, float]]:
    """[(le, cumulative count)] of one histogram series, in the order of their bounds."""
    found = [
        (float(got["le"]), value) for got, value in series(samples, f"{name}_bucket", **labels)
    ]
    return sorted(found)


def test_queue_and_run_time_histograms_by_task_and_backend(
    inprocess_daemon: InProcessDaemon,
) -> None:
    with inprocess_daemon.client() as client:
        for _ in range(3):
            client.run("noop")
        client.run("sleep", {"ms": SLEEP_MS})
    samples = scrape(inprocess_daemon)
    cpu = {"backend": "cpu", "fallback": "false"}
    assert series(samples, "taogpud_job_run_seconds_count", task="noop", **cpu)[0][1] == 3
    assert series(samples, "taogpud_job_queue_seconds_count", task="noop", **cpu)[0][1] == 3
    assert series(samples, "taogpud_job_run_seconds_count", task="sleep", **cpu)[0][1] == 1
    # the sleep held its slot for SLEEP_MS: in no bucket below that, in every one above a second
    sleep = buckets(samples, "taogpud_job_run_seconds", task="sleep", **cpu)
    assert all(count == 0 for bound, count in sleep if bound < SLEEP_MS / 1e3)
    assert all(count == 1 for bound, count in sleep if bound >= 1.0)
    assert sleep[-1] == (float("inf"), 1)
    ran_s = series(samples, "taogpud_job_run_seconds_sum", task="sleep", **cpu)[0][1]
    assert SLEEP_MS / 1e3 <= ran_s < 10
    noop = [count for _, count in buckets(samples, "taogpud_job_queue_seconds", task="noop", **cpu)]
    assert noop == sorted(noop) and noop[-1] == 3  # cumulative, ending with all three


def test_a_job_cancelled_in_the_queue_is_no_queue_time(inprocess_daemon: InProcessDaemon) -> None:
    """It never got a slot: the run-time histogram would hold a job that never ran."""
    with inprocess_daemon.client() as client:
        holders = [client.submit("sleep", {"ms": 20_000}) for _ in range(4)]  # 2 workers × 2 slots
        waiting = client.submit("noop")
        client.cancel(waiting["id"])
        for job in holders:
            client.cancel(job["id"])
    samples = scrape(inprocess_daemon)
    assert series(samples, "taogpud_job_run_seconds_count", task="noop") == []
    assert series(samples, "taogpud_jobs_finished_total", task="noop", status="cancelled")


def test_fallback_jobs_carry_the_fallback_label(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    daemon = inprocess_factory(
        settings={"gpu": {"backend": "cuda", "allowFallbackToCpu": True}},
        config={"runtime": {"device_type": "gpu"}, "backend": {"cuda": {"enabled": True}}},
    )
    with daemon.client() as client:
        client.run("noop")
    samples = scrape(daemon)
    found = series(samples, "taogpud_job_run_seconds_count", task="noop", backend="cpu")
    assert [(labels["fallback"], count) for labels, count in found] == [("true", 1)]


def dashboard_queries() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in document["panels"] for target in panel["targets"]]
    queries += [
        variable["query"]["query"]
        for variable in document["templating"]["list"]
        if variable["type"] == "query"
    ]
    return queries


def names_in(query: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL query uses; Grafana's $variables left out."""
    text = re.sub(r'"[^"]*"', '""', query)  # label values, not names
    text = re.sub(r"\$\w+", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # range durations: [5m], [1h]
    labels = set(re.findall(r"(\w+)\s*=~?", text))
    for grouping in re.findall(r"by \(([^)]*)\)", text):
        labels |= {word.strip() for word in grouping.split(",")}
    if query.startswith("label_values("):
        labels.add(query.rstrip(")").split(",")[-1].strip())
    words = set(re.findall(r"[a-z_][a-z0-9_]*", text)) - labels - PROMQL_WORDS - {"label_values"}
    return words, labels


def test_every_dashboard_query_names_what_the_daemon_exports(
    inprocess_daemon: InProcessDaemon,
) -> None:
    with inprocess_daemon.client() as client:
        client.run("noop")  # the histograms have a series once a job has run
    samples = scrape(inprocess_daemon)
    labels_seen = {label for rows in samples.values() for got, _ in rows for label in got}
    queries = dashboard_queries()
    assert len(queries) >= 10
    for query in queries:
        metrics, labels = names_in(query)
        assert metrics, query
        assert metrics <= samples.keys(), (query, sorted(metrics - samples.keys()))
        assert labels <= labels_seen | SCRAPE_LABELS, (query, sorted(labels - labels_seen))


def test_the_query_reader_catches_a_misspelt_name() -> None:
    """The check above can fail: a name the daemon never exports is found as a metric."""
    metrics, labels = names_in(
        'sum by (task) (rate(taogpud_job_runtime_seconds_count{backend="cpu"}[5m]))'
    )
    assert metrics == {"taogpud_job_runtime_seconds_count"} and labels == {"task", "backend"}
