"""Tests of the controller tools (tests/tools): the GPU acceptance tools (tools/build-bundle,
tools/lock-profile, tools/gpu-acceptance, tools/make-tiny-model's acceptance mode) and
tools/reliability-report. Executables whose logic is still in them are imported with
``tool_loader.load_tool`` (tests/shared). No fixtures of their own beyond the root conftest's."""
