"""The kind tier: real containers from the project's images on a real kind cluster (make kind-e2e)."""
