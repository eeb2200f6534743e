"""The parts of ``bench/realsize``: the results it writes on the controller (``results``)."""
