"""Fixtures of the runtime's tests, CPU and GPU alike."""

from meter_helpers import seen  # noqa: F401 (a fixture: a recorder installed for one test)
