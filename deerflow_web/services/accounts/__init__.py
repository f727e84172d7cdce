"""Accounts (SPEC 7): users, sessions, API tokens, lockouts.

Plain Python over the shared database (`storage/database.py`); the web layer turns these
into cookies, headers and pages, and the command line uses them directly.
"""
