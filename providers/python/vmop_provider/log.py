"""Lines in the operator's structured log, tagged with the plugin (the `log` import).
Never log a secret: the host redacts the values it knows, but only those."""

from wit_world.imports.log import Level, log

from .errors import bounded


def debug(message: str):
    log(Level.DEBUG, bounded(message))


def info(message: str):
    log(Level.INFO, bounded(message))


def warn(message: str):
    log(Level.WARN, bounded(message))
