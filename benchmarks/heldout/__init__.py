"""The held-out benchmark set: see README.md and run.py."""
