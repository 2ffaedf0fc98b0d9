"""End-to-end tier: a real Kubernetes control plane built locally (see testkit/cluster)."""
