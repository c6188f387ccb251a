"""The ramp's serving side, in one home: `arms` (which arm serves a session, the host's shared
session table, the worker's fast guard).
"""
