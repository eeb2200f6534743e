"""Tests of the bake-off (tests/bakeoff): its filters (filter_plugins/bakeoff.py) and
playbooks/bakeoff.yml run on localhost against stand-ins for the deploy, rollback and gate
playbooks. No fixtures of their own beyond the root conftest's."""
