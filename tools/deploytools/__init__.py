"""The logic of the executables in tools/: each ``tools/<name>`` is a thin entry point that
imports ``deploytools.<module>`` (Python finds the package beside the executable, under any
interpreter) and calls its ``main``.

Nothing is imported here: the modules run under different interpreters (the controller's
venv, the CPU lock's venv for ``make_tiny_model``, a host's system python3, 3.8 or newer, for
``health_gate_cli`` and ``api_key_check``)."""
