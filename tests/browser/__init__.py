"""Tests that drive a real headless Chromium (marked `browser`)."""
