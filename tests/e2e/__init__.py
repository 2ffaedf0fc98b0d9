"""End-to-end tier: a real Kubernetes control plane built locally (see tests/e2e/cluster)."""
