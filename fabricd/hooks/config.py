"""Hook settings (``ServerSettings.hooks``): a list of mappings, validated at start.

    hooks:
      - {kind: webhook, url: https://ops.example/fabricd, secret: s3cret}
      - {kind: alertmanager, url: http://alertmanager:9093}
      - {kind: slack, url: https://hooks.slack.com/services/T000/B000/XXXX}

A bad entry raises ``HookConfigError`` naming the key (``hooks[1].url: ...``), so a typo is found
when the service starts, not when the first incident should have paged someone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator


class HookConfigError(ValueError):
    """An invalid hook entry; the message names the bad key."""


class _Hook(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""  # label value in metrics and logs; default "<kind>-<index>"
    url: str
    timeout_seconds: float = Field(default=5.0, gt=0)
    # Retries: 5 attempts over ~8 s by default (0.5, 1, 2, 4 s, jittered) ride out a receiver
    # restart without holding a notification for minutes.
    max_attempts: int = Field(default=5, ge=1, le=20)
    backoff_initial_seconds: float = Field(default=0.5, ge=0)
    backoff_max_seconds: float = Field(default=30.0, ge=0)
    queue_size: int = Field(default=1000, ge=1)  # notifications waiting; past it new ones are dropped
    verify_tls: bool = True

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
        return v

    @field_validator("name")
    @classmethod
    def _label_safe(cls, v: str) -> str:
        if len(v) > 64 or any(c.isspace() for c in v):
            raise ValueError("must be at most 64 characters without whitespace")
        return v


class WebhookHook(_Hook):
    kind: Literal["webhook"]
    secret: str = ""  # HMAC-SHA256 key; empty = unsigned (the receiver cannot authenticate us)
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. an Authorization header


class AlertmanagerHook(_Hook):
    kind: Literal["alertmanager"]
    # Alertmanager ends an alert that is not re-sent within its resolve_timeout (5 m by default),
    # so open incidents are pushed again well inside that.
    repush_seconds: float = Field(default=60.0, gt=0)
    labels: dict[str, str] = Field(default_factory=dict)  # extra labels, e.g. {cluster: prod}
    headers: dict[str, str] = Field(default_factory=dict)


class SlackHook(_Hook):
    kind: Literal["slack"]
    channel: str = ""  # only for webhooks that allow overriding it
    username: str = "fabricd"


HookConfig = Annotated[WebhookHook | AlertmanagerHook | SlackHook, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[list[HookConfig]] = TypeAdapter(list[HookConfig])


class _Names(BaseModel):
    hooks: list[HookConfig]

    @model_validator(mode="after")
    def _unique(self) -> _Names:
        names = [h.name for h in self.hooks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"hook names must be unique: {', '.join(dupes)}")
        return self


def parse_hooks(raw: Sequence[Mapping[str, Any]]) -> list[HookConfig]:
    """Validate ``ServerSettings.hooks``; default names are ``<kind>-<index>``."""
    try:
        hooks = _ADAPTER.validate_python([dict(entry) for entry in raw])
    except ValidationError as exc:
        raise HookConfigError(_describe(exc)) from exc
    named = [h if h.name else h.model_copy(update={"name": f"{h.kind}-{i}"}) for i, h in enumerate(hooks)]
    try:
        _Names(hooks=named)
    except ValidationError as exc:
        raise HookConfigError("hooks: " + exc.errors()[0]["msg"].removeprefix("Value error, ")) from exc
    return named


KINDS = ("webhook", "alertmanager", "slack")


def _message(err: Any) -> str:
    # pydantic's wording for the discriminator ("Unable to extract tag using discriminator 'kind'")
    # names its internals, not the fix.
    if err["type"] == "union_tag_not_found":
        return f"missing; each hook needs kind: {', '.join(KINDS)}"
    if err["type"] == "union_tag_invalid":
        return f"{err['input'].get('kind')!r} is not a hook kind; use one of {', '.join(KINDS)}"
    return str(err["msg"]).removeprefix("Value error, ")


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = list(err["loc"])
        # pydantic puts the discriminator's value in the path (hooks[0].webhook.url): drop it.
        key = f"hooks[{loc[0]}]" + "".join(f".{p}" for p in loc[2:] if isinstance(p, str | int))
        if len(loc) == 1 or err["type"] in {"union_tag_invalid", "union_tag_not_found"}:
            key = f"hooks[{loc[0]}].kind" if err["type"].startswith("union_tag") else key
        parts.append(f"{key}: {_message(err)}")
    return "invalid hook settings: " + "; ".join(parts)
