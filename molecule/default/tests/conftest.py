"""The journals on a failed check; systemd-analyze's rating of the unit (the fixture systemd_exposure)."""

import pytest

# molecule/shared/verify_plugin.py: the hooks and fixtures every scenario's verifier shares
# (each test's outcome as rep_<phase>, systemd_exposure).
pytest_plugins = ["verify_plugin"]


@pytest.fixture(autouse=True)
def journal_on_failure(host, request):
    """Print the journals of the server, its watchdog and its give-up recorder when a check fails."""
    yield
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        units = "-u inference-server -u inference-server-watchdog -u inference-server-gave-up"
        print(host.run(f"journalctl {units} --no-pager -n 200").stdout)
