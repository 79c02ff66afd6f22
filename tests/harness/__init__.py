"""Pieces shared by the Python tests (tests/harness/wire.py: the coordinator's wire)."""
