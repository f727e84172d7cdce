"""The model's view of a thread: the upload context block (`context_block`), what each turn
announces (`turn`), the `list_uploaded_files` result (`tool_listing`), outlines, untrusted
text neutralising (`untrusted`), read-only file access for the tools (`file_access`), and
the chat preview page's replay of all of it (`chat_preview`)."""
