"""Samplers for `latprof attach` and `latprof top`: a running process seen from outside (py-spy, /proc, sockets, PostgreSQL)."""
