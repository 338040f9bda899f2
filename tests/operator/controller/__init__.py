"""controller/: one controller module at a time (kube.py against the emulator, handlers, metrics, main)."""
