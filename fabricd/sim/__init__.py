"""The fabric simulator: scenarios, counter model, writers, live mode (docs/simulator.md)."""
