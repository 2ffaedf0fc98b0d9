"""Cross-request batching: pending entries, the batch scheduler and the admission bound."""
