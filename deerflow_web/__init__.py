"""deerflow-web: thread-isolated file workspace for LLM-agent conversations."""
