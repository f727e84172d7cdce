"""The file manager's pages for people: threads, a thread's files, previews, and their forms."""
