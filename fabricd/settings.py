"""Settings: built in ``main()`` from a YAML/TOML file, then the environment, then flags.

Precedence (lowest to highest): defaults < config file < ``FABRICD_*`` environment variables
(nested keys with ``__``, e.g. ``FABRICD_SPOOL__MAX_BYTES``) < command-line flags. Everything is
validated at start; a bad value raises ``SettingsError`` whose message names the key and the
file it came from, so an operator never discovers a typo mid-collection.
"""

from __future__ import annotations

import contextvars
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

LogLevel = Literal["debug", "info", "warning", "error"]
DEFAULT_PORT = 9470
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


class SettingsError(ValueError):
    """Invalid settings; the message names the bad key (and the file, when one was read)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SpoolSettings(_Strict):
    """On-disk spool used while the central service is unreachable (docs/transport.md)."""

    dir: Path | None = None  # default: <data_dir>/spool
    # 256 MiB holds about an hour of a busy node's telemetry at a 1 s interval; past it the
    # oldest batches are dropped (counted and reported), never the agent.
    max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    # Backlog drain rate, so a long outage does not starve live data or flood the central.
    drain_batches_per_second: float = Field(default=20.0, gt=0)


class TransportSettings(_Strict):
    batch_max_samples: int = Field(default=5000, gt=0)
    batch_max_seconds: float = Field(default=5.0, gt=0)
    timeout_seconds: float = Field(default=10.0, gt=0)
    backoff_initial_seconds: float = Field(default=0.5, gt=0)
    backoff_max_seconds: float = Field(default=30.0, gt=0)
    compress: bool = True
    encoding: Literal["msgpack", "json"] = "msgpack"
    ca_file: Path | None = None  # custom CA to verify the central service's certificate
    verify_tls: bool = True
    # Wire format version the agent writes (docs/wire-format.md). 2 is this release's; 1 is what
    # the previous release wrote and read: set it while the central is still on that release.
    wire_version: int = 2

    @field_validator("wire_version")
    @classmethod
    def _writable(cls, v: int) -> int:
        from fabricd.wire import ENCODERS

        if v not in ENCODERS:
            raise ValueError(
                f"must be one of {', '.join(map(str, sorted(ENCODERS)))} (the wire versions fabricd writes)"
            )
        return v


class LimitSettings(_Strict):
    """Ingest limits: a rogue agent cannot explode storage or Prometheus cardinality."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_samples_per_batch: int = Field(default=50_000, gt=0)
    max_label_value_length: int = Field(default=128, gt=0)
    max_series_per_node: int = Field(default=20_000, gt=0)
    max_pending_batches: int = Field(default=256, gt=0)  # load shedding (429) before memory runs out


# The config file's values for the settings being built now (set by ``load`` only).
_FILE_VALUES: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fabricd_file_values", default=None
)


class _FileSource(PydanticBaseSettingsSource):
    """The config file as the lowest-priority settings source."""

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


class _Base(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FABRICD_", env_nested_delimiter="__", extra="forbid")

    log_level: LogLevel = "info"
    log_format: Literal["logfmt", "json"] = "logfmt"
    data_dir: Path = Path("data")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init) beat the environment, which beats the config file.
        return (init_settings, env_settings, _FileSource(settings_cls, _FILE_VALUES.get() or {}))


class AgentSettings(_Base):
    node: str = Field(default_factory=socket.gethostname)
    central: str = f"http://{DEFAULT_LISTEN}"
    token: str = ""
    sysfs_root: Path = Path("/sys")
    interval_seconds: float = Field(default=10.0, ge=0)
    collector_timeout_seconds: float = Field(default=5.0, gt=0)
    # Collector name -> its options (validated by the collector's own Options model at start).
    collectors: dict[str, dict[str, Any]] = Field(default_factory=dict)
    spool: SpoolSettings = Field(default_factory=SpoolSettings)
    transport: TransportSettings = Field(default_factory=TransportSettings)
    metrics_listen: str = ""  # optional local /metrics for shops that scrape nodes directly

    @field_validator("node")
    @classmethod
    def _node_name(cls, v: str) -> str:
        if not v or len(v) > 128 or any(c.isspace() for c in v):
            raise ValueError("must be 1-128 characters without whitespace")
        return v


class ServerSettings(_Base):
    listen: str = DEFAULT_LISTEN
    db: str = ""  # any SQLAlchemy URL; default sqlite:///<data_dir>/fabricd.db
    auth: bool = True  # require bearer tokens on ingest and the API
    bootstrap_token_file: Path | None = None  # token file written for the demo / first start
    limits: LimitSettings = Field(default_factory=LimitSettings)
    raw_retention_seconds: float = Field(default=6 * 3600, gt=0)
    retention_seconds: float = Field(default=14 * 86400, gt=0)
    downsample_step_seconds: float = Field(default=60.0, gt=0)
    rules_dir: Path | None = None  # default: the shipped rules/detection
    detection: bool = True  # run the detection engine on the stored stream
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    hooks: list[dict[str, Any]] = Field(default_factory=list)
    # A revoked token keeps working for at most this long (per-process lookup cache).
    token_cache_seconds: float = Field(default=2.0, ge=0)
    # /metrics leaves out series not updated for this long; a node silent this long is "stale".
    metrics_stale_seconds: float = Field(default=300.0, gt=0)
    node_stale_seconds: float = Field(default=120.0, gt=0)
    detection_interval_seconds: float = Field(default=1.0, gt=0)
    maintenance_interval_seconds: float = Field(default=300.0, gt=0)
    # Latest values live in memory and are written to the series table this often (and at
    # shutdown); after a crash they are rebuilt from the points stored since (docs/storage.md).
    latest_flush_seconds: float = Field(default=30.0, gt=0)

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_listen(v)
        return v

    def database_url(self) -> str:
        return self.db or f"sqlite:///{self.data_dir / 'fabricd.db'}"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9470`` for IPv6) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML (``.yaml``/``.yml``) or TOML (``.toml``) mapping; errors name the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read config file: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: the top level must be a mapping of settings")
    return data


S = TypeVar("S", bound=_Base)


def load(cls: type[S], config: Path | None = None, overrides: Mapping[str, Any] | None = None) -> S:
    """Build settings: file < environment < ``overrides`` (flags; ``None`` values are ignored)."""
    file_values = read_config_file(config) if config else {}
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    token = _FILE_VALUES.set(file_values)
    try:
        return cls(**flags)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, config)) from exc
    finally:
        _FILE_VALUES.reset(token)


def _describe(exc: ValidationError, config: Path | None) -> str:
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{key}: {err['msg'].removeprefix('Value error, ')}")
    where = f"{config} (or FABRICD_* environment): " if config else ""
    return f"{where}invalid settings: " + "; ".join(parts)
