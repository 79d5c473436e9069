"""Alert hooks: tell the tools on-call engineers already use when an incident opens, is acked or resolves.

- ``webhook``: a signed JSON POST (HMAC-SHA256 in ``X-Fabricd-Signature``), retried with backoff.
- ``alertmanager``: the incident as an alert on Alertmanager's v2 API, re-pushed while open so it
  never times out, pushed with ``endsAt`` when it resolves.
- ``slack``: a Slack-compatible incoming-webhook message (also accepted by Mattermost, Rocket.Chat).

``HookDispatcher`` sends them from its own queue and tasks: a slow or failing hook never blocks
detection or ingest; its failures are counted in ``fabricd_hook_notifications_total{hook,outcome}``
and logged.
"""

from fabricd.hooks.config import HookConfig, HookConfigError, parse_hooks
from fabricd.hooks.dispatcher import HookDispatcher

__all__ = ["HookConfig", "HookConfigError", "HookDispatcher", "parse_hooks"]
