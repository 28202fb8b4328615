"""Models the project can run without a model hub: the embedded default model and tiny
random-weight test models; the family registry (families.py), the config.json fields
read as transformers writes them (config_fields.py) and the record of architectures
outside the table that `prefillonly verify` passed (verified_architectures.py), plain
Python all three."""
