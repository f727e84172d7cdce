"""Archives (.zip, .tar, .tar.gz): their members read safely, listed, and extracted.

`reader` opens an archive and lists or streams its members under `ArchiveLimits`, naming
every refusal; `members` gives the agent's tools a member by virtual path
(`/mnt/user-data/uploads/reports.zip/q3/summary.docx`), its bytes and its converted text
cached in the thread's own folder; `extract` writes an archive's members into a folder of
the thread. No Flask, no LangChain.
"""
