"""``HookDispatcher``: dedupe, queue and deliver incident notifications without blocking anyone.

``notify(incident, incident_id)`` is cheap and synchronous (callable from the detection loop, or
from a worker thread): it drops a repeat of the state already notified and puts the notification
on each hook's bounded queue. One task per hook delivers, retrying with exponential backoff and
jitter; a full queue drops the newest notification (counted, logged) rather than growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from fabricd import logs
from fabricd.hooks.config import HookConfig, parse_hooks
from fabricd.hooks.payload import Notification
from fabricd.hooks.senders import Request, Sender, sender_for
from fabricd.hooks.transport import Poster, PosterFactory, PostResult, default_poster
from fabricd.model import Incident, IncidentKind, IncidentState, Severity

log = logging.getLogger("fabricd.hooks")

OUTCOMES = ("delivered", "retried", "failed", "dropped")
_DEDUPE_MAX = 10_000  # incidents whose last state is remembered (oldest forgotten first)
_REPUSH = object()  # queue marker: re-push Alertmanager's open alerts, in order with state changes


class HookMetrics:
    def __init__(self, registry: CollectorRegistry, hooks: Sequence[str]) -> None:
        self.notifications = Counter(
            "fabricd_hook_notifications",
            "Incident notifications by hook and outcome (delivered, retried = extra attempts, "
            "failed = gave up, dropped = queue full)",
            ["hook", "outcome"],
            registry=registry,
        )
        self.queue = Gauge("fabricd_hook_queue_depth", "Notifications waiting per hook", ["hook"], registry=registry)
        for name in hooks:
            for outcome in OUTCOMES:
                self.notifications.labels(name, outcome)


@dataclass
class _Hook:
    cfg: HookConfig
    sender: Sender
    poster: Poster
    queue: asyncio.Queue[Any]


def _is_retryable(result: PostResult) -> bool:
    return result.status == 0 or result.status in {408, 425, 429} or result.status >= 500


class HookDispatcher:
    def __init__(
        self,
        hooks: Sequence[HookConfig],
        *,
        base_url: str,
        registry: CollectorRegistry | None = None,
        poster_factory: PosterFactory = default_poster,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.base_url = base_url
        self.clock = clock
        self.sleep = sleep
        self.metrics = HookMetrics(registry or CollectorRegistry(auto_describe=True), [h.name for h in hooks])
        self.hooks = {
            h.name: _Hook(h, sender_for(h, base_url), poster_factory(h.verify_tls), asyncio.Queue(h.queue_size))
            for h in hooks
        }
        for name, hook in self.hooks.items():
            self.metrics.queue.labels(name).set_function(hook.queue.qsize)
        self._last: OrderedDict[str, IncidentState] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_settings(cls, settings: Any, registry: CollectorRegistry | None = None, **kwargs: Any) -> HookDispatcher:
        """From ``ServerSettings``: ``hooks`` validated (``HookConfigError`` names the key)."""
        host, _, port = settings.listen.rpartition(":")
        host = "127.0.0.1" if host in {"", "0.0.0.0"} else host
        scheme = "https" if settings.tls_certfile else "http"
        kwargs.setdefault("base_url", f"{scheme}://{host}:{port}")
        return cls(parse_hooks(settings.hooks), registry=registry, **kwargs)

    # --- lifecycle (the server's lifespan) ---

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for hook in self.hooks.values():
            self._tasks.append(asyncio.create_task(self._worker(hook), name=f"hook-{hook.cfg.name}"))
            repush = getattr(hook.cfg, "repush_seconds", None)
            if repush is not None:
                self._tasks.append(asyncio.create_task(self._ticker(hook, repush), name=f"hook-repush-{hook.cfg.name}"))

    async def stop(self, drain_seconds: float = 5.0) -> None:
        """Give queued notifications ``drain_seconds`` to go out, then stop the tasks."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.drain(), drain_seconds)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for hook in self.hooks.values():
            closer = getattr(hook.poster, "aclose", None)
            if closer is not None:
                await closer()

    async def drain(self) -> None:
        await asyncio.gather(*(hook.queue.join() for hook in self.hooks.values()))

    # --- the seam the detection engine calls ---

    def notify(self, incident: Incident, incident_id: str | int | None = None) -> bool:
        """Queue a notification if ``incident`` is in a state not yet notified; True if queued."""
        key = str(incident_id if incident_id is not None else incident.key)
        if self._last.get(key) is incident.state:
            return False
        self._last[key] = incident.state
        self._last.move_to_end(key)
        while len(self._last) > _DEDUPE_MAX:
            self._last.popitem(last=False)
        self._enqueue_threadsafe(Notification(key, incident, incident.state))
        return True

    def _enqueue_threadsafe(self, item: Any) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is not None and running is not self._loop and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._enqueue, item)
        else:
            self._enqueue(item)

    def _enqueue(self, item: Any) -> None:
        for name, hook in self.hooks.items():
            try:
                hook.queue.put_nowait(item)
            except asyncio.QueueFull:
                self.metrics.notifications.labels(name, "dropped").inc()
                logs.event(
                    log,
                    logging.ERROR,
                    "hook queue full, notification dropped",
                    hook=name,
                    incident=getattr(item, "incident_id", ""),
                )

    # --- delivery ---

    async def _worker(self, hook: _Hook) -> None:
        while True:
            item = await hook.queue.get()
            try:
                await self._handle(hook, item)
            except Exception as exc:  # a bug in one hook must not kill its worker
                logs.event(log, logging.ERROR, "hook worker error", hook=hook.cfg.name, error=repr(exc))
            finally:
                hook.queue.task_done()

    async def _handle(self, hook: _Hook, item: Any) -> str:
        now = self.clock()
        requests = hook.sender.repush(now) if item is _REPUSH else hook.sender.requests(item, now)
        outcome = "delivered"
        for request in requests:
            if await self._deliver(hook, request) != "delivered":
                outcome = "failed"
        return outcome

    async def _ticker(self, hook: _Hook, seconds: float) -> None:
        while True:
            await self.sleep(seconds)
            if hook.queue.empty():  # a backlog will carry fresh state anyway
                hook.queue.put_nowait(_REPUSH)

    async def _deliver(self, hook: _Hook, request: Request) -> str:
        cfg, name = hook.cfg, hook.cfg.name
        for attempt in range(1, cfg.max_attempts + 1):
            result = await hook.poster.post(request.url, request.body, request.headers, cfg.timeout_seconds)
            if 200 <= result.status < 300:
                self.metrics.notifications.labels(name, "delivered").inc()
                return "delivered"
            retry = _is_retryable(result) and attempt < cfg.max_attempts
            logs.event(
                log,
                logging.WARNING if retry else logging.ERROR,
                "hook delivery failed" + (", retrying" if retry else ", giving up"),
                hook=name,
                url=request.url,
                status=result.status,
                attempt=attempt,
                error=result.error,
            )
            if not retry:
                break
            self.metrics.notifications.labels(name, "retried").inc()
            await self.sleep(self._backoff(cfg, attempt, result.retry_after))
        self.metrics.notifications.labels(name, "failed").inc()
        return "failed"

    @staticmethod
    def _backoff(cfg: HookConfig, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, cfg.backoff_max_seconds)
        delay = min(cfg.backoff_initial_seconds * 2 ** (attempt - 1), cfg.backoff_max_seconds)
        return delay * (0.5 + random.random() / 2)  # jitter: receivers restarting are not stampeded

    # --- the test endpoint / command ---

    async def send_test(self, name: str | None = None) -> dict[str, str]:
        """Send a test notification now (bypassing dedupe and queues); hook name -> outcome."""
        targets = [self.hooks[name]] if name is not None else list(self.hooks.values())
        n = Notification("test", sample_incident(self.clock()), IncidentState.OPEN, test=True)
        return {hook.cfg.name: await self._handle(hook, n) for hook in targets}


def sample_incident(now: float) -> Incident:
    return Incident(
        key="test",
        kind=IncidentKind.CONGESTION,
        severity=Severity.INFO,
        state=IncidentState.OPEN,
        element="fabricd-test",
        summary="fabricd test notification: this hook is configured correctly",
        started_ts=now,
        updated_ts=now,
    )
