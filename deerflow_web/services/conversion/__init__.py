"""Conversion to Markdown: `runner` runs one conversion in a bounded child process
(`worker`), and `jobs` runs them in the background and keeps their state in the records."""
