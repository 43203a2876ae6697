"""The engine emulator: a synchronized decode group behind G OpenAI-compatible endpoints."""
