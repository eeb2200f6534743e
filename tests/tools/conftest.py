"""Tests of the controller tools (tests/tools): the GPU acceptance tools (tools/build-bundle,
tools/lock-profile, tools/gpu-acceptance, tools/make-tiny-model's acceptance mode) and
tools/reliability-report. Their code is imported from ``deploytools`` (tools/deploytools); the
executables are run for their command line. No fixtures of their own beyond the root conftest's."""
