"""Stage 4: run task runs — model client, tools, consent, executor — and emit records."""
