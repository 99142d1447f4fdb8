"""Attacks on the guarantees: consent, the verdict, the sandbox, bounded input."""
