"""Stage 5: records and reports — calls.jsonl, junit.xml, summary.md and summary.json."""
