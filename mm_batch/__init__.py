"""mm-batch: run LLM agent prompts as CI steps, judged by what really ran."""

__version__ = "0.1.0"
