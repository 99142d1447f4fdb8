"""Test doubles that speak real protocols: the JSON HTTP server under them, and on it a fake
OpenAI-compatible model."""
