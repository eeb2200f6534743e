"""Tests of tools/nightly-deploy and playbooks/nightly.yml (tests/nightly).

Their helpers are test_nightly_support.py (imported by the other ``test_nightly_*`` modules);
the fixture project they run for real through ansible-runner, and the recorded job events,
are in fixtures/ (tests/nightly/fixtures). test_nightly_playbook.py needs docker. No fixtures
of their own beyond the root conftest's.
"""
