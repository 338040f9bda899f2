"""e2e/: the real operator (``python -m ddpjob_operator``) over HTTP against the API emulator.

Moving onto the real control plane (issue #22): the operator's e2e tests that run there live in
tests/cluster/e2e/ (the helm-installed operator, the real API server, scheduler and garbage
collector). What is still here either needs what the real API server cannot be made to do on
demand (a throttled create, test_operator_throttled.py says why) or is not ported yet: the soak.

Apart from controller/ because these test no one module but the operator as a whole, every
room through kopf, with the kubelet played by ddpjob_sandbox.scripted (pods never run).
"""
