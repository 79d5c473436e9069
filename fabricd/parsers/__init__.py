"""Pure parsers for what fabric tools print (issue 17): one module per format, typed results, no I/O
beyond the text they are given. The collectors, ``fabricd parse`` and the topology code all call these;
nothing here imports a collector, the agent, the server or the CLI (import-linter ``parsers-pure``).

A parser never raises on its input: what it cannot read becomes a ``Problem`` in its result.
"""
