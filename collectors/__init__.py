"""Collectors: one module per signal source."""
