"""Tests of the gateway role (tests/gateway: roles/gateway, smg's launcher, the worker module
and the drain wait). The integration tests need smg from ``make gateway-venv`` and the
rehearsal engine of ``make tools-venv model`` under ``$DEPLOY_CACHE_DIR``. No fixtures of
their own beyond the root conftest's."""
