"""The commands: plain functions that the CLI calls, each returning an exit code."""
