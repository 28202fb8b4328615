"""Models the project can run without a model hub: the embedded default model and tiny
random-weight test models; the family registry (families.py) and the config.json fields
read as transformers writes them (config_fields.py), plain Python both."""
