"""controller/: one controller module at a time, with no API server (handlers, metrics, main's flags, the
cache's store, error sorting); their I/O against the real one: tests/cluster/controller/."""
