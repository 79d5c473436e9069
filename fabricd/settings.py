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
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fabricd.settings_base import Strict as _Strict
from fabricd.settings_base import doc as _doc
from fabricd.settings_delivery import BusSettings as BusSettings
from fabricd.settings_delivery import SpoolSettings as SpoolSettings
from fabricd.settings_delivery import TransportSettings as TransportSettings

LogLevel = Literal["debug", "info", "warning", "error"]
DEFAULT_PORT = 9470
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


class SettingsError(ValueError):
    """Invalid settings; the message names the bad key (and the file, when one was read)."""


class LimitSettings(_Strict):
    """Ingest limits: a rogue agent cannot explode storage or Prometheus cardinality."""

    max_body_bytes: int = _doc(16 * 1024 * 1024, "Largest request body (compressed) ingest accepts.", gt=0)
    max_samples_per_batch: int = _doc(50_000, "Most samples in one batch.", gt=0)
    max_label_value_length: int = _doc(
        128, "Longest device, port or label value (it becomes a Prometheus label).", gt=0
    )
    max_series_per_node: int = _doc(20_000, "Most series one node may create; past it ingest answers 429.", gt=0)
    max_pending_batches: int = _doc(
        256, "Batches being stored at once; past it ingest sheds load with 429 before memory runs out.", gt=0
    )


class SettlementSettings(_Strict):
    """Event-time settlement of the detection loop (docs/detection.md, "Settlement")."""

    step_seconds: float | None = _doc(
        None,
        "At most one evaluation per this much settled event time (default a fifth of the scrape interval, >= 1 s).",
        gt=0,
    )
    lateness_seconds: float | None = _doc(
        None, "A node this late past its watermark is left out of settlement (default 0.5 x its interval + 5 s).", gt=0
    )
    slack: float = _doc(0.2, "Fraction of a scrape interval a node's next scrape may come early.", ge=0, lt=1)


class ReplicaSettings(_Strict):
    """``fabricd server`` as one of N replicas on one PostgreSQL and NATS (docs/operations.md, "Replicas")."""

    enabled: bool = _doc(
        False, "Claim bus partitions and store them; one elected replica detects. Needs bus.url, PostgreSQL."
    )
    id: str = _doc("", "This replica's name in the status API and pg_stat_activity (default: hostname:port of listen).")
    partitions: list[int] = _doc(list, "Bus partitions this replica may claim (default: all of 0..bus.partitions-1).")
    lease_seconds: float = _doc(
        10.0, "A replica silent this long loses its partitions (PostgreSQL ends its session).", ge=2
    )
    warmup_seconds: float = _doc(
        900.0, "A new correlator rebuilds detection state from this much stored history.", ge=0
    )

    @field_validator("id")
    @classmethod
    def _short_id(cls, v: str) -> str:  # it goes into application_name (63 bytes)
        if len(v) > 40 or any(c.isspace() for c in v):
            raise ValueError("must be at most 40 characters without whitespace")
        return v


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

    log_level: LogLevel = _doc("info", "Log level.")
    log_format: Literal["logfmt", "json"] = _doc("logfmt", "Log line format: logfmt (key=value) or JSON.")
    data_dir: Path = _doc(
        Path("data"), "Data folder (agent: the spool; server: the SQLite database), created on start."
    )

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
    """``fabricd agent`` and ``fabricd collect``."""

    node: str = _doc(
        socket.gethostname, "This node's name, as the central and the dashboards show it (default: hostname)."
    )
    central: str = _doc(f"http://{DEFAULT_LISTEN}", "URL of the central service (http:// or https://).")
    token: str = _doc("", "Bearer token for ingest (fabricd token create --role agent); better in the environment.")
    token_file: Path | None = _doc(
        None, "Read the token from this file instead (a Kubernetes or compose secret, systemd LoadCredential=)."
    )
    sysfs_root: Path = _doc(Path("/sys"), "sysfs mount to read (/host/sys in a container).")
    interval_seconds: float = _doc(10.0, "Scrape interval.", ge=0)
    collector_timeout_seconds: float = _doc(5.0, "A collector still running after this long is reported failed.", gt=0)
    # Collector name -> its options (validated by the collector's own Options model at start).
    collectors: dict[str, dict[str, Any]] = _doc(
        dict, "Collector name -> its options (docs/collectors.md); empty: infiniband alone."
    )
    spool: SpoolSettings = _doc(SpoolSettings, "On-disk spool while the central is unreachable.")
    transport: TransportSettings = _doc(TransportSettings, "Batching and delivery.")
    bus: BusSettings = _doc(BusSettings, "NATS JetStream between agents and the central (docs/transport.md).")
    metrics_listen: str = _doc("", "HOST:PORT to serve this agent's own /metrics on; empty: none.")

    @field_validator("node")
    @classmethod
    def _node_name(cls, v: str) -> str:
        if not v or len(v) > 128 or any(c.isspace() for c in v):
            raise ValueError("must be 1-128 characters without whitespace")
        return v

    @model_validator(mode="after")
    def _read_token_file(self) -> AgentSettings:
        if self.token_file is None:
            return self
        if self.token:
            raise ValueError("token_file: set token or token_file, not both")
        try:
            self.token = self.token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"token_file: cannot read {self.token_file}: {exc.strerror}") from exc
        if not self.token:
            raise ValueError(f"token_file: {self.token_file} is empty")
        return self

    @field_validator("central")
    @classmethod
    def _central_url(cls, v: str) -> str:
        # Refused at start: a typo would otherwise spool forever against an address that never answers.
        parts = urlsplit(v)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise ValueError(f"{v!r} is not an http:// or https:// URL with a host, e.g. http://fabricd-central:9470")
        return v


class ServerSettings(_Base):
    """``fabricd server``, ``fabricd token`` and ``fabricd hooks``."""

    listen: str = _doc(DEFAULT_LISTEN, "HOST:PORT to serve on ([::]:9470 for IPv6).")
    db: str = _doc(
        "", "SQLAlchemy URL; default sqlite:///<data_dir>/fabricd.db (PostgreSQL: postgresql+psycopg://...)."
    )
    auth: bool = _doc(True, "Require bearer tokens on ingest and the API.")
    bootstrap_token_file: Path | None = _doc(None, "With no admin token yet, create one and write it here (mode 0600).")
    limits: LimitSettings = _doc(LimitSettings, "Ingest limits.")
    raw_retention_seconds: float = _doc(6 * 3600, "Raw points are kept this long, then downsampled.", gt=0)
    retention_seconds: float = _doc(14 * 86400, "Downsampled points are kept this long.", gt=0)
    downsample_step_seconds: float = _doc(60.0, "Step of downsampled points.", gt=0)
    rules_dir: Path | None = _doc(None, "Folder of detection rules (default: the shipped rules/detection).")
    detection: bool = _doc(True, "Run the detection engine on the stored stream.")
    settlement: SettlementSettings = _doc(SettlementSettings, "When a moment of event time is evaluated.")
    tls_certfile: Path | None = _doc(None, "Serve HTTPS with this certificate (PEM); with tls_keyfile.")
    tls_keyfile: Path | None = _doc(None, "Private key of tls_certfile (PEM).")
    hooks: list[dict[str, Any]] = _doc(list, "Alert hooks: webhook, alertmanager, slack (docs/prometheus.md).")
    # A revoked token keeps working for at most this long (per-process lookup cache).
    token_cache_seconds: float = _doc(2.0, "A revoked token keeps working at most this long (lookup cache).", ge=0)
    metrics_stale_seconds: float = _doc(300.0, "/metrics leaves out series not updated for this long.", gt=0)
    node_stale_seconds: float = _doc(120.0, "A node silent this long is reported stale.", gt=0)
    bus: BusSettings = _doc(BusSettings, "NATS JetStream between agents and the central (docs/transport.md).")
    replica: ReplicaSettings = _doc(ReplicaSettings, "Several central replicas on one PostgreSQL (docs/operations.md).")
    metrics_fleet_view: bool = _doc(
        False,
        "Also export every node's latest series and per-node agent health on /metrics (grows with the "
        "fleet; Prometheus should scrape the agents instead).",
    )
    metrics_fleet_max_series: int = _doc(
        500_000, "Hard cap on the fleet view's series per scrape; the rest are refused and counted.", ge=1
    )
    detection_interval_seconds: float = _doc(
        1.0, "Longest wait between two detection reads of what was stored; a stored batch wakes it sooner.", gt=0
    )
    maintenance_interval_seconds: float = _doc(300.0, "How often retention and downsampling run.", gt=0)
    topology_watch_seconds: float = _doc(
        60.0, "How often the agents' LLDP topology is compared with the stored one (changes are logged).", gt=0
    )
    # After a crash latest values are rebuilt from the points stored since (docs/storage.md).
    latest_flush_seconds: float = _doc(30.0, "Latest values live in memory and are written this often.", gt=0)
    # Longer than the agents' transport.keepalive_seconds (55 s): the client, not the server, ends an
    # idle connection, so no send goes out on a connection being closed (nginx's default is 75 s).
    # Agents sending every interval then keep one connection: at 10,000 agents a reconnect per batch
    # would be 1,000 TCP (and TLS) handshakes a second at the central.
    keepalive_timeout_seconds: int = _doc(
        75, "An idle client connection is closed after this long (longer than the agents' keepalive_seconds).", gt=0
    )
    # Past uvicorn's 10 s drain and the last write; under the shipped units' 60 s (server/shutdown.py).
    shutdown_timeout_seconds: float = _doc(
        45.0, "A stop not finished this long after SIGTERM exits with code 70 and every thread's stack.", gt=0
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_listen(v)
        return v

    @model_validator(mode="after")
    def _replica_needs(self) -> ServerSettings:
        if self.replica.enabled:
            if not self.bus.url:
                raise ValueError("replica.enabled: needs bus.url (the partitions are the bus's)")
            if not self.db.startswith("postgresql"):
                raise ValueError("replica.enabled: needs a PostgreSQL db (advisory locks; SQLite has one writer)")
            if bad := [p for p in self.replica.partitions if not 0 <= p < self.bus.partitions]:
                raise ValueError(f"replica.partitions: {bad} outside 0..{self.bus.partitions - 1}")
        return self

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
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(_yaml_error(path, exc)) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: the top level must be a mapping of settings")
    return data


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: <problem>``, the shape editors and compilers use."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = ": ".join(str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
    return f"{where}: not valid YAML: {problem or exc}"


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
        key = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{key}: {msg}" if key else msg)  # a whole-model check names its keys itself
    where = f"{config} (or FABRICD_* environment): " if config else ""
    return f"{where}invalid settings: " + "; ".join(parts)
