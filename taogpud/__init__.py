"""taogpud: a system daemon that runs GPU compute jobs for everyone on a host.

Nothing heavy is imported here: spawned workers import this package before they
choose their device, so numpy and cupy stay out of it.
"""

__version__ = "0.1.0"
