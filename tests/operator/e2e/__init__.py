"""e2e/: the real operator (``python -m ddpjob_operator``) over HTTP against the API emulator.

Apart from controller/ because these test no one module but the operator as a whole, every
room through kopf, with the kubelet played by ddpjob_sandbox.scripted (pods never run); they
take seconds each, so `pytest tests/operator/{api,render,decide}` stays a quick loop. Runs
with real processes in pods are tests/sandbox/'s.
"""
