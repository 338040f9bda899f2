"""api/: the spec model, the generated CRD (and its CEL rules run with cel-python), generated names."""
