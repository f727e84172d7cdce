"""Bytes and records on disk, with no rules about requests, limits or people.

- `paths`: where a thread's folders are, virtual `/mnt/user-data` paths, staging names.
- `filenames`: client names made safe, unique names, the companion naming rule.
- `local`: staging files, the atomic all-or-nothing commit, no-follow checks, scans, sweeps.
- `sniff`: content types and the binary check from a file's first bytes.
- `records`: the upload records (SQLite); `chat_turns`: the chat preview's saved turns;
  `sqlite`: the per-thread connection both use.
- `objects`: file bytes by key, in the data dir or an S3 bucket, behind one contract.
"""
