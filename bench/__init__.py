"""Benchmarks: each module ``bench.<name>`` has a ``main()`` that measures side by side and prints a table."""
