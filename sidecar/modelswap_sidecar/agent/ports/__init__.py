"""Adapters between the lifecycle core and the outside: the control API's backend, the
gateway's directory, the reports, the cluster heartbeat and its node report, the desired
file, the Kubernetes client and the control API's serving certificate."""
