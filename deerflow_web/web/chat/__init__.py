"""The chat preview page: what the model would receive for a message, and its forms."""
