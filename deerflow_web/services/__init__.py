"""Plain-Python services shared by the web layer and the agent side, one package per domain.

- `uploads`: the upload rules and the commit of a request's files, the response shape,
  bulk delete, the threads index.
- `conversion`: Markdown companions: the bounded runner, its worker process, background jobs.
- `prompt`: what the model sees: the upload context block, per-turn decisions, the
  `list_uploaded_files` result, outlines, untrusted-text neutralising, file access for the
  tools, and the chat preview that replays all of it.
- `files`: what the file manager shows: listings and filters, areas, kinds, sizes,
  previews, Markdown rendering, artifact resolution.

No module here imports Flask or LangChain; byte mechanics live in `storage/`.
"""
