"""Training: state, sharded initialisation, the compiled step."""
