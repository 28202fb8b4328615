"""Models the project can run without a model hub: the embedded default model and tiny
random-weight test models."""
