"""Rules: one per file, discovered automatically."""
