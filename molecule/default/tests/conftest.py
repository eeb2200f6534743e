"""Make each test's outcome visible to fixtures (used to dump the journal on failure)."""

import pytest


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Attach the report of each phase to the test item as rep_<phase>."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
