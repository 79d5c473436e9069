"""Alert hooks against a real local HTTP receiver: signature, retries, dedupe, Slack format, isolation."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from fabricd.hooks import HookConfigError, HookDispatcher, parse_hooks
from fabricd.hooks.api import router
from fabricd.hooks.payload import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    Notification,
    alertmanager_alert,
    verify,
)
from fabricd.model import (
    Candidate,
    Evidence,
    Incident,
    IncidentKind,
    IncidentState,
    Severity,
)

SECRET = "correct horse battery staple"
BASE = "http://fabricd.example:9470"


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A real HTTP server in a thread; answers each POST with the next scripted status (then 200)."""

    statuses: list[int] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def received(self, path: str | None = None) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if path is None or d.path == path]

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.deliveries.append(Delivery(self.path, dict(self.headers.items()), body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    rec.server = ThreadingHTTPServer(("127.0.0.1", 0), rec.handler())
    thread = threading.Thread(target=rec.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        rec.server.shutdown()
        rec.server.server_close()
        thread.join(5)


def incident(state: IncidentState = IncidentState.OPEN, severity: Severity = Severity.CRITICAL) -> Incident:
    return Incident(
        key="congestion:leaf-02~spine-01",
        kind=IncidentKind.CONGESTION,
        severity=severity,
        state=state,
        element="leaf-02~spine-01",
        summary="leaf-02 ~ spine-01 congested: ECN marks at 12% on 37 pairs",
        started_ts=1_700_000_000.0,
        updated_ts=1_700_000_060.0,
        resolved_ts=1_700_000_600.0 if state is IncidentState.RESOLVED else None,
        candidates=[Candidate("leaf-02~spine-01", 0.93), Candidate("leaf-02", 0.41)],
        affected=["node-017|node-033", "node-018|node-040"],
        evidence=[Evidence("ecn_marked_ratio", "node-033", "mlx5_0", "1", 0.12, 0.05, 1_700_000_050.0)],
    )


def hook(kind: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "url": url, "backoff_initial_seconds": 0.01, "backoff_max_seconds": 0.05, **extra}


def sample_value(registry: CollectorRegistry, hook_name: str, outcome: str) -> float:
    value = registry.get_sample_value("fabricd_hook_notifications_total", {"hook": hook_name, "outcome": outcome})
    return value or 0.0


def test_config_errors_name_the_key() -> None:
    with pytest.raises(HookConfigError, match=r"hooks\[0\]\.url"):
        parse_hooks([{"kind": "webhook"}])
    with pytest.raises(HookConfigError, match=r"hooks\[1\]\.url: .*http"):
        parse_hooks([hook("slack", "http://x"), hook("webhook", "ftp://x")])
    with pytest.raises(HookConfigError, match=r"hooks\[0\]\.kind"):
        parse_hooks([{"kind": "pagerduty", "url": "http://x"}])
    with pytest.raises(HookConfigError, match=r"hooks\[0\]\.max_attemps"):
        parse_hooks([hook("webhook", "http://x", max_attemps=3)])
    with pytest.raises(HookConfigError, match="unique: ops"):
        parse_hooks([hook("webhook", "http://x", name="ops"), hook("slack", "http://y", name="ops")])
    names = [h.name for h in parse_hooks([hook("webhook", "http://x"), hook("alertmanager", "http://y")])]
    assert names == ["webhook-0", "alertmanager-1"]


async def test_webhook_is_signed_and_retried_after_500(receiver: Receiver) -> None:
    receiver.statuses = [500, 503]
    registry = CollectorRegistry()
    d = HookDispatcher(
        parse_hooks([hook("webhook", receiver.url + "/fabricd", secret=SECRET)]), base_url=BASE, registry=registry
    )
    await d.start()
    try:
        assert d.notify(incident(), 42)
        await d.drain()
    finally:
        await d.stop()
    got = receiver.received("/fabricd")
    assert len(got) == 3, "two 5xx answers, then delivered on the third attempt"
    assert len({g.headers[DELIVERY_HEADER] for g in got}) == 1, "retries carry the same delivery id"
    for g in got:
        assert verify(SECRET, g.body, g.headers[SIGNATURE_HEADER])
        assert g.headers[SIGNATURE_HEADER].startswith("sha256=")
    assert not verify("wrong secret", got[0].body, got[0].headers[SIGNATURE_HEADER])
    body = got[-1].json()
    assert got[-1].headers[EVENT_HEADER] == body["event"] == "incident.opened"
    inc = body["incident"]
    assert (inc["id"], inc["kind"], inc["severity"], inc["element"]) == (
        "42",
        "congestion",
        "critical",
        "leaf-02~spine-01",
    )
    assert inc["report"] == f"{BASE}/api/v1/incidents/42/report"
    link = inc["evidence"][0]["link"]
    assert link.startswith(f"{BASE}/api/v1/series?node=node-033&device=mlx5_0&port=1&counter=ecn_marked_ratio")
    assert sample_value(registry, "webhook-0", "delivered") == 1
    assert sample_value(registry, "webhook-0", "retried") == 2
    assert sample_value(registry, "webhook-0", "failed") == 0


async def test_one_notification_per_state_change(receiver: Receiver) -> None:
    d = HookDispatcher(parse_hooks([hook("webhook", receiver.url)]), base_url=BASE)
    await d.start()
    try:
        states = [IncidentState.OPEN] * 3 + [IncidentState.ACKED] * 2 + [IncidentState.RESOLVED] * 2
        queued = [d.notify(incident(s), 7) for s in states]
        assert queued == [True, False, False, True, False, True, False]
        assert d.notify(incident(IncidentState.OPEN), 7), "a reopened incident is a new state change"
        assert d.notify(incident(IncidentState.OPEN), 8), "another incident is notified on its own"
        await d.drain()
    finally:
        await d.stop()
    events = [(g.json()["incident"]["id"], g.json()["event"]) for g in receiver.received()]
    assert events == [
        ("7", "incident.opened"),
        ("7", "incident.acked"),
        ("7", "incident.resolved"),
        ("7", "incident.opened"),
        ("8", "incident.opened"),
    ]


async def test_client_error_is_not_retried_and_is_counted(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.statuses = [400]
    registry = CollectorRegistry()
    d = HookDispatcher(parse_hooks([hook("webhook", receiver.url, name="ops")]), base_url=BASE, registry=registry)
    await d.start()
    with caplog.at_level(logging.ERROR, logger="fabricd.hooks"):
        d.notify(incident(), 1)
        await d.drain()
    await d.stop()
    assert len(receiver.received()) == 1
    assert sample_value(registry, "ops", "failed") == 1
    assert any("giving up" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


async def test_failing_hook_never_blocks_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing listens on this port: every attempt fails; the queue holds 5, the rest are dropped.
    dead = "http://127.0.0.1:9"
    registry = CollectorRegistry()
    cfg = hook("webhook", dead, name="dead", max_attempts=2, queue_size=5, timeout_seconds=0.5)
    d = HookDispatcher(parse_hooks([cfg]), base_url=BASE, registry=registry)
    await d.start()
    with caplog.at_level(logging.WARNING, logger="fabricd.hooks"):
        queued = [d.notify(incident(), i) for i in range(200)]  # synchronous: returns without waiting
        assert all(queued)
        await d.drain()
    await d.stop()
    dropped = sample_value(registry, "dead", "dropped")
    failed = sample_value(registry, "dead", "failed")
    assert dropped >= 200 - 5 - 1 and dropped + failed == 200
    assert sample_value(registry, "dead", "delivered") == 0
    assert any("queue full" in r.getMessage() for r in caplog.records)


async def test_slack_incoming_webhook_format(receiver: Receiver) -> None:
    d = HookDispatcher(
        parse_hooks([hook("slack", receiver.url + "/services/T0/B0/X", channel="#fabric")]), base_url=BASE
    )
    await d.start()
    d.notify(incident(), 42)
    d.notify(incident(IncidentState.RESOLVED), 42)
    await d.drain()
    await d.stop()
    opened, resolved = (g.json() for g in receiver.received("/services/T0/B0/X"))
    assert opened["text"].startswith("[OPEN] congestion on leaf-02~spine-01 (critical)")
    assert opened["channel"] == "#fabric"
    att = opened["attachments"][0]
    assert att["title_link"] == f"{BASE}/api/v1/incidents/42/report"
    assert att["color"] == "#d62728"
    assert {
        "title": "ecn_marked_ratio",
        "value": "0.12 (threshold 0.05) on node-033/mlx5_0/1",
        "short": False,
    } in att["fields"]
    assert resolved["text"].startswith("[RESOLVED]") and resolved["attachments"][0]["color"] == "#2ca02c"


async def test_test_endpoint_reports_outcome_per_hook(receiver: Receiver) -> None:
    receiver.statuses = [200, 404]
    cfgs = parse_hooks(
        [
            hook("webhook", receiver.url + "/ok", name="ok", secret=SECRET),
            hook("slack", receiver.url + "/gone", name="gone"),
        ]
    )
    app = FastAPI()
    app.include_router(router())
    app.state.hooks = HookDispatcher(cfgs, base_url=BASE)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        listed = (await client.get("/api/v1/hooks")).json()
        assert listed == [
            {"name": "ok", "kind": "webhook", "target": receiver.url},
            {"name": "gone", "kind": "slack", "target": receiver.url},
        ]
        assert (await client.post("/api/v1/hooks/test")).json() == {"ok": "delivered", "gone": "failed"}
        assert (await client.post("/api/v1/hooks/nope/test")).status_code == 404
    await app.state.hooks.stop()
    body = receiver.received("/ok")[0]
    assert body.json()["event"] == "test" and verify(SECRET, body.body, body.headers[SIGNATURE_HEADER])


@pytest.fixture
def keep_root_logger() -> Iterator[None]:
    # The command configures logging as main() does; give pytest its handlers back afterwards.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("keep_root_logger")
def test_hooks_test_command(receiver: Receiver, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fabricd.hooks import cli

    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump({"hooks": [hook("webhook", receiver.url, name="ops", secret=SECRET)]}))
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["hooks", "test", "-c", str(config)])
    assert args.func(args) == 0
    assert capsys.readouterr().out == "ops\tdelivered\n"
    assert receiver.received()[0].json()["incident"]["element"] == "fabricd-test"
    config.write_text(yaml.safe_dump({"hooks": [{"kind": "webhook", "url": "nope"}]}))
    assert args.func(args) == 2
    assert "hooks[0].url" in capsys.readouterr().err


async def test_an_ambiguous_incident_says_so_with_each_candidates_weight(receiver: Receiver) -> None:
    uplinks = [f"leaf-02~spine-0{i}" for i in (1, 2, 3, 4)]
    inc = replace(
        incident(),
        key="congestion:leaf-02",
        element="leaf-02",
        ambiguous=True,
        candidates=[Candidate(u, 0.2, 0.25) for u in uplinks],
    )
    d = HookDispatcher(parse_hooks([hook("webhook", receiver.url + "/fabricd")]), base_url=BASE)
    await d.start()
    try:
        assert d.notify(inc, 7)
        await d.drain()
    finally:
        await d.stop()
    body = receiver.received("/fabricd")[-1].json()["incident"]
    assert body["ambiguous"] is True
    assert body["candidates"] == [{"element": u, "score": 0.2, "weight": 0.25} for u in uplinks]
    # Alertmanager gets the places to check as an annotation (an exact incident gets none)
    alert = alertmanager_alert(Notification("7", inc, IncidentState.OPEN), BASE, {}, 0.0)
    assert alert["annotations"]["candidates"] == ", ".join(f"{u} (weight 0.25)" for u in uplinks)
    exact = alertmanager_alert(Notification("7", incident(), IncidentState.OPEN), BASE, {}, 0.0)
    assert "candidates" not in exact["annotations"]
