"""The EncoderPool operator (kopf). Entry point: ``encoderpool-operator`` (encoderpool_operator.cli:main)."""
