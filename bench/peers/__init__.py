"""One module per system measured beside taogpud, each with a `measure(...)` (bench/dispatch.py)."""
