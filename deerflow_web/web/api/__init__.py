"""The JSON API: DeerFlow's upload, artifact and thread routes, tus, the API description, health."""
