"""Detection: signals from samples, declarative rules, detectors, localization, incidents."""

from fabricd.detect.engine import DetectionEngine

__all__ = ["DetectionEngine"]
