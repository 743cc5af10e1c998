"""Model: what is tuned (loading a model, the zoo, task extraction, the tensor-intrinsics cache)."""
