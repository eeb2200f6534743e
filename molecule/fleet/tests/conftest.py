"""systemd-analyze's rating of the monitoring units (the fixture systemd_exposure), printed at the end of the run."""

# molecule/shared/verify_plugin.py: the hooks and fixtures every scenario's verifier shares.
pytest_plugins = ["verify_plugin"]
