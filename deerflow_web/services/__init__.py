"""Plain-Python services shared by the web layer and the agent side."""
