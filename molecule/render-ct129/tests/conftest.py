"""Nothing shared beyond testinfra's host fixture."""
