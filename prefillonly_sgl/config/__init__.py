"""The one runtime configuration (runtime_config.py): what `Engine(...)` and `prefillonly
serve` ask for, resolved once into a frozen RuntimeConfig from the feature registry
(features/), the memory budget (memory/), the model (models/) and the machine
(machine/). Plain Python; imported by the entry points, the SGLang runtime and the
features' process modules (WorkerConfig), never by what it imports.
"""
