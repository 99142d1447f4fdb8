"""Stage 1: load and validate agent and tasks files into frozen, typed data."""
