"""Analysis: a capture's events as a timeline of requests, and the numbers the rules read."""
