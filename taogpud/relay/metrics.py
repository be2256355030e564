"""The relay's Prometheus counters: requests and tokens by model, status and uid."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from taogpud.relay.usage import UseTable

LABELS = ["model", "status", "uid"]


class RelayCollector:
    def __init__(self, use: UseTable) -> None:
        self.use = use

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("taogpud_relay_requests", "relay requests", labels=LABELS)
        tokens = CounterMetricFamily(
            "taogpud_relay_tokens", "tokens the provider reported", labels=[*LABELS, "side"]
        )
        for key, count in self.use.requests.items():
            # no uid (a request refused before its token was known): the empty label, which
            # Prometheus reads as no label, not the string "None"
            labels = [key.model, str(key.status), "" if key.uid is None else str(key.uid)]
            requests.add_metric(labels, count)
            tokens.add_metric([*labels, "input"], self.use.input_tokens[key])
            tokens.add_metric([*labels, "output"], self.use.output_tokens[key])
        yield requests
        yield tokens
