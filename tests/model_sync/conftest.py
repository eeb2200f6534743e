"""Tests of model_sync (tests/model_sync: roles/model_sync's engine and role, the Hub's
refusals, and tools/deploytools/model_layout.py, the one derivation of the serving path).
test_model_sync_role.py imports its model builder from test_model_sync_engine.py (same
folder). No fixtures of their own beyond the root conftest's."""
