"""The logic of the executables in tools/: each ``tools/<name>`` is a thin entry point that
puts ``tools/lib`` on ``sys.path`` and calls ``deploytools.<module>.main``."""
