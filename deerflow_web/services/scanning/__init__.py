"""Virus scanning with ClamAV's clamd: every upload is scanned before anyone sees it.

`clamd.py` speaks clamd's socket protocol (INSTREAM, VERSION, PING); `scanner.py` holds the
policy (fail-closed unless `scanning.on_unavailable` says otherwise) and the sink an upload
feeds while it streams; `rescan.py` scans stored files again when the signatures change
and quarantines what they now find; `events.py` keeps what was refused and quarantined.
Off unless `scanning.clamd` is configured.
"""
