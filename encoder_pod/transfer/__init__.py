"""Where an embedding goes once encoded: back in the HTTP response (inline) or pushed to prefill."""
