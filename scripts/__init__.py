"""The project's scripts, run as modules from the repository's root (`python -m scripts.soak`):
a package, so that they import taogpud and the harness (taogpud.testing) with no path set up."""
