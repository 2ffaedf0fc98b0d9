"""The HTTP edge of the encoder pod."""
