"""decide/: pure decisions over a job and its observed pods, on a fixed clock."""
