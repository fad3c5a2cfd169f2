"""`latprof attach` and `latprof top`: a running service sampled from outside, and what its samples say."""
