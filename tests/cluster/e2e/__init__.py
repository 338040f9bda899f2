"""e2e/: the helm-installed operator (tests/cluster/operators.py: one release per set of flags,
running as its Deployment's pod under the chart's ServiceAccount) against the real control plane.

The kubelet's part for the pods of these tests is played by the test: their pods go to Nodes that
run no process (ddpjob_sandbox.control_plane.status_nodes) and the test writes their status
through pods/status, as ddpjob_sandbox.scripted does; the API server, admission, RBAC, the garbage
collector and the scheduler are the real ones. Runs with real processes in pods are
tests/cluster/test_operator_on_cluster.py's.
"""
