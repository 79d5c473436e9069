"""Per-kind request builders: a notification in, the HTTP requests to make out (no I/O)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from fabricd.hooks.config import AlertmanagerHook, HookConfig, SlackHook, WebhookHook
from fabricd.hooks.payload import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    Notification,
    alertmanager_alert,
    alertmanager_labels,
    encode,
    rfc3339,
    sign,
    slack_body,
    webhook_body,
)
from fabricd.model import IncidentState

JSON = {"Content-Type": "application/json", "User-Agent": "fabricd-hooks/1"}


@dataclass(frozen=True, slots=True)
class Request:
    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


class Sender(Protocol):
    def requests(self, n: Notification, now: float) -> list[Request]: ...

    def repush(self, now: float) -> list[Request]: ...


class WebhookSender:
    def __init__(self, cfg: WebhookHook, base_url: str) -> None:
        self.cfg = cfg
        self.base_url = base_url

    def requests(self, n: Notification, now: float) -> list[Request]:
        body = encode(webhook_body(n, self.base_url))
        headers = {**JSON, **self.cfg.headers, EVENT_HEADER: n.event, DELIVERY_HEADER: str(uuid.uuid4())}
        if self.cfg.secret:
            headers[SIGNATURE_HEADER] = sign(self.cfg.secret, body)
        return [Request(self.cfg.url, body, headers)]

    def repush(self, now: float) -> list[Request]:
        return []


class SlackSender:
    def __init__(self, cfg: SlackHook, base_url: str) -> None:
        self.cfg = cfg
        self.base_url = base_url

    def requests(self, n: Notification, now: float) -> list[Request]:
        body = slack_body(n, self.base_url, self.cfg.channel, self.cfg.username)
        return [Request(self.cfg.url, encode(body), dict(JSON))]

    def repush(self, now: float) -> list[Request]:
        return []


class AlertmanagerSender:
    """Keeps the open alerts so they can be re-pushed, and ends an alert whose labels changed.

    Alertmanager identifies an alert by its label set: when an incident's severity changes, the
    old label set is sent with ``endsAt`` so it does not linger until it times out.
    """

    def __init__(self, cfg: AlertmanagerHook, base_url: str) -> None:
        self.cfg = cfg
        self.base_url = base_url
        self.url = cfg.url.rstrip("/") + "/api/v2/alerts"
        self.open: dict[str, Notification] = {}

    def requests(self, n: Notification, now: float) -> list[Request]:
        alerts = [alertmanager_alert(n, self.base_url, self.cfg.labels, now)]
        previous = self.open.pop(n.incident_id, None)
        if previous is not None and self._labels(previous) != self._labels(n):
            ended = alertmanager_alert(previous, self.base_url, self.cfg.labels, now)
            ended["endsAt"] = rfc3339(now)
            alerts.append(ended)
        if n.state is not IncidentState.RESOLVED and not n.test:
            self.open[n.incident_id] = n
        return [self._request(alerts)]

    def repush(self, now: float) -> list[Request]:
        if not self.open:
            return []
        return [self._request([alertmanager_alert(n, self.base_url, self.cfg.labels, now) for n in self.open.values()])]

    def _labels(self, n: Notification) -> dict[str, str]:
        return alertmanager_labels(n, self.cfg.labels)

    def _request(self, alerts: list[dict[str, Any]]) -> Request:
        return Request(self.url, encode(alerts), {**JSON, **self.cfg.headers})


def sender_for(cfg: HookConfig, base_url: str) -> Sender:
    if isinstance(cfg, WebhookHook):
        return WebhookSender(cfg, base_url)
    if isinstance(cfg, SlackHook):
        return SlackSender(cfg, base_url)
    return AlertmanagerSender(cfg, base_url)
