"""One module per system measured beside taogpud, each with a `measure(...)` for bench/dispatch.py."""
