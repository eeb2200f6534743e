"""Role-level tests (tests/roles): the inference server's unit helpers (port guard, drain),
converged, deploy_lock, adopt, the roles' host-side helpers and every module's documentation.
test_drain.py runs the rehearsal engine (tests/shared/rehearsal_engine.py, ``make tools-venv
model``). No fixtures of their own beyond the root conftest's."""
