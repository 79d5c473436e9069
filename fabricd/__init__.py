"""fabricd: network-fabric telemetry and diagnostics for AI clusters."""

__version__ = "0.1.0"
