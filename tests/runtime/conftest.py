"""Fixtures of the runtime's tests, CPU and GPU alike."""

from kit.meter import seen  # noqa: F401 (a fixture: a recorder installed for one test)
