"""Stage 2: what the model sees of a tool, and how one of its calls becomes an argv."""
