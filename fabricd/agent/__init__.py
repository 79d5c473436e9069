"""The per-node agent: collectors -> counter semantics -> transport."""
