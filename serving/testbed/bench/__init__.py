"""The trace benchmark client: replay a trace against OpenAI-compatible endpoints."""
