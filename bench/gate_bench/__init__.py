"""The two experiments of ``bench/gate`` (crash detection, throughput) and what they share."""
