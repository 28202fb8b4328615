"""What the process runs on, in plain Python: its environment variables (environment.py,
the one module that reads them), the device's SGLang defaults (device_defaults.py) and
free TCP ports for the servers it starts (ports.py).

Imports nothing of the package but itself: every other folder may import it.
"""
