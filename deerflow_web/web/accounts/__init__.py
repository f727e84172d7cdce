"""Accounts: the gate every request passes, DeerFlow's auth API, the account pages and forms."""
