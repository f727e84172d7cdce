"""The file manager's view: the uploads rows (`listing`, `list_query`), the outputs and
workspace areas (`browse`), file kinds, sizes, previews, Markdown rendering, and which file
a virtual path names and how a browser may get it (`artifacts`)."""
