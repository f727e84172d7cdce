"""A thread's history: versions of replaced files and the trash of deleted ones (issue 27)."""
