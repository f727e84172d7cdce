"""Everything that touches the thread folders and the upload records on disk."""
