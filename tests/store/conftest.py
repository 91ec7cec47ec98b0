"""The shared ``conn`` fixture: a fresh schema database (a module may define its own)."""

from tests.dbkit import conn  # noqa: F401 - a fixture, found by pytest under this name
