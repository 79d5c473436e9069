"""Test harnesses: the netns lab, its agents, and helpers that run the central service in tests."""
