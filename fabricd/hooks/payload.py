"""Pure builders for what each hook sends: no I/O here, so every format is tested byte for byte.

Times are the incident's event times (``started_ts``, ``resolved_ts``), RFC 3339 in UTC.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fabricd.model import Evidence, Incident, IncidentState

PAYLOAD_VERSION = 1
SIGNATURE_HEADER = "X-Fabricd-Signature"
EVENT_HEADER = "X-Fabricd-Event"
DELIVERY_HEADER = "X-Fabricd-Delivery"  # the same on every retry, so a receiver can drop repeats
EVIDENCE_WINDOW_SECONDS = 900.0  # series links show 15 min before the evidence's timestamp
TEST_ALERT_SECONDS = 60.0

_EVENTS = {
    IncidentState.OPEN: "incident.opened",
    IncidentState.ACKED: "incident.acked",
    IncidentState.RESOLVED: "incident.resolved",
}
_SLACK_COLORS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4", "resolved": "#2ca02c"}


@dataclass(frozen=True, slots=True)
class Notification:
    """One incident in one state, as the dispatcher queues it (``incident_id`` from the store)."""

    incident_id: str
    incident: Incident
    state: IncidentState
    test: bool = False

    @property
    def event(self) -> str:
        return "test" if self.test else _EVENTS[self.state]


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of the exact body bytes (as GitHub's ``X-Hub-Signature-256``)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does: constant-time comparison of the header against our own signature."""
    return hmac.compare_digest(sign(secret, body), header)


def report_url(base_url: str, incident_id: str) -> str:
    return f"{base_url.rstrip('/')}/api/v1/incidents/{incident_id}/report"


def incident_url(base_url: str, incident_id: str) -> str:
    return f"{base_url.rstrip('/')}/api/v1/incidents/{incident_id}"


def evidence_link(base_url: str, ev: Evidence) -> str:
    """The REST series that fired, around the moment it fired."""
    query = {
        "node": ev.node,
        "device": ev.device,
        "port": ev.port,
        "counter": ev.signal,
        "since": rfc3339(ev.ts - EVIDENCE_WINDOW_SECONDS),
        "until": rfc3339(ev.ts),
    }
    return f"{base_url.rstrip('/')}/api/v1/series?" + urlencode({k: v for k, v in query.items() if v})


def _evidence(base_url: str, ev: Evidence) -> dict[str, Any]:
    return {
        "signal": ev.signal,
        "node": ev.node,
        "device": ev.device,
        "port": ev.port,
        "value": ev.value,
        "threshold": ev.threshold,
        "at": rfc3339(ev.ts),
        "labels": dict(ev.labels),
        "note": ev.note,
        "link": evidence_link(base_url, ev),
    }


def webhook_body(n: Notification, base_url: str) -> dict[str, Any]:
    inc = n.incident
    return {
        "version": PAYLOAD_VERSION,
        "event": n.event,
        "incident": {
            "id": n.incident_id,
            "key": inc.key,
            "kind": inc.kind.value,
            "severity": inc.severity.value,
            "state": n.state.value,
            "element": inc.element,
            "summary": inc.summary,
            "started_at": rfc3339(inc.started_ts),
            "updated_at": rfc3339(inc.updated_ts),
            "resolved_at": rfc3339(inc.resolved_ts) if inc.resolved_ts is not None else None,
            "affected": list(inc.affected),
            "affected_jobs": [j.to_json() for j in inc.affected_jobs],
            # ``ambiguous``: the evidence cannot tell the candidates apart (docs/detection.md); their
            # ``weight`` is each one's share of it, what an on-call engineer checks first
            "ambiguous": inc.ambiguous,
            "candidates": [{"element": c.element, "score": c.score, "weight": c.weight} for c in inc.candidates],
            "evidence": [_evidence(base_url, ev) for ev in inc.evidence],
            "url": incident_url(base_url, n.incident_id),
            "report": report_url(base_url, n.incident_id),
        },
    }


def encode(body: Any) -> bytes:
    """Compact, key-sorted JSON: the bytes that are signed are the bytes that are sent."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def alert_name(n: Notification) -> str:
    return "FabricdTest" if n.test else "Fabricd" + "".join(w.title() for w in n.incident.kind.value.split("_"))


def alertmanager_labels(n: Notification, extra: dict[str, str]) -> dict[str, str]:
    inc = n.incident
    labels = {
        "alertname": alert_name(n),
        "severity": inc.severity.value,
        "kind": inc.kind.value,
        "element": inc.element,
        "incident_id": n.incident_id,
        "source": "fabricd",
    }
    return {**extra, **labels}


def alertmanager_alert(n: Notification, base_url: str, extra: dict[str, str], now: float) -> dict[str, Any]:
    """One postableAlert (Alertmanager OpenAPI v2). Resolved: ``endsAt`` = when it resolved."""
    inc = n.incident
    alert: dict[str, Any] = {
        "labels": alertmanager_labels(n, extra),
        "annotations": {
            "summary": inc.summary,
            "description": _description(inc),
            "report": report_url(base_url, n.incident_id),
            "affected": ", ".join(inc.affected[:20]),
            **({"candidates": _candidates(inc)} if inc.ambiguous else {}),
        },
        "startsAt": rfc3339(inc.started_ts),
        "generatorURL": incident_url(base_url, n.incident_id),
    }
    if n.test:
        alert["endsAt"] = rfc3339(now + TEST_ALERT_SECONDS)  # visible for a minute, then gone by itself
    elif n.state is IncidentState.RESOLVED:
        # endsAt must not be in the future or Alertmanager keeps the alert firing until then.
        ended = inc.resolved_ts if inc.resolved_ts is not None else now
        alert["endsAt"] = rfc3339(min(ended, now))
    return alert


def _candidates(inc: Incident) -> str:
    """``leaf-02~spine-01 (weight 0.25), ...``: an ambiguous incident's places to check."""
    return ", ".join(f"{c.element} (weight {c.weight:g})" for c in inc.candidates)


def _description(inc: Incident) -> str:
    lines = [f"{inc.kind.value} on {inc.element} since {rfc3339(inc.started_ts)}"]
    lines += [f"{ev.signal}={ev.value:.4g} (threshold {ev.threshold:.4g}) on {_where(ev)}" for ev in inc.evidence[:5]]
    return "\n".join(lines)


def _where(ev: Evidence) -> str:
    return "/".join(p for p in (ev.node, ev.device, ev.port) if p)


def slack_body(n: Notification, base_url: str, channel: str = "", username: str = "fabricd") -> dict[str, Any]:
    """Incoming-webhook message: ``text`` for notifications, one attachment for the details."""
    inc = n.incident
    state = n.state.value
    color = _SLACK_COLORS["resolved" if n.state is IncidentState.RESOLVED else inc.severity.value]
    title = f"[{state.upper()}] {inc.kind.value} on {inc.element} ({inc.severity.value})"
    fields = [
        {"title": "Affected", "value": ", ".join(inc.affected[:10]) or "-", "short": True},
        {"title": "Since", "value": rfc3339(inc.started_ts), "short": True},
    ]
    if inc.affected_jobs:
        jobs = ", ".join(f"{j.job_id} ({j.user})" for j in inc.affected_jobs[:10])
        fields.append({"title": "Jobs", "value": jobs, "short": False})
    fields += [
        {"title": ev.signal, "value": f"{ev.value:.4g} (threshold {ev.threshold:.4g}) on {_where(ev)}", "short": False}
        for ev in inc.evidence[:5]
    ]
    body: dict[str, Any] = {
        "username": username,
        "text": f"{title}: {inc.summary}",
        "attachments": [
            {
                "color": color,
                "title": title,
                "title_link": report_url(base_url, n.incident_id),
                "text": inc.summary,
                "fields": fields,
                "fallback": f"{title}: {inc.summary}",
            }
        ],
    }
    if channel:
        body["channel"] = channel
    return body
