"""Backends: one folder per target family behind the :class:`~.base.Backend` interface.

``registry.backend_for(target)`` is the only place a target kind picks a backend. Each backend
folder holds its device checks, policy, micro-model, lowering and one rule file per op class
(``rules/``); ``base.py`` is the interface they implement.
"""
