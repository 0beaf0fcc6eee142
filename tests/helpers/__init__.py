"""Helpers that the tests import (``tests/`` is on ``sys.path``, so this package is ``helpers``):

- ``waiting``: ``wait_until``, the one bounded wait for a condition that another party brings about.
- ``processes``: spawned worker processes of one test (the ``children`` fixture), and talking to them.
- ``mp_workers``, ``gil_workers``: the functions those processes run (spawn children import them by name).
- ``lock_waiter``: a thread that waits for a lease, for tests of release wake-ups.

Scripts that tests run by path (``tests/pulse_hammer.py``) stay beside the tests that run them.
"""
