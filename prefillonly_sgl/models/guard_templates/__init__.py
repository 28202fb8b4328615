"""Guard models' chat templates and taxonomies as package data (plain Python, no imports
beyond the standard library): one .jinja per template, one .json per guard with its
categories or risks, their codes and definitions, the verdict format and where each
template was found and how faithful it is (README.md beside this file says the same in
prose). The moderation feature and the tiny guard checkpoints
(models/tiny_guard_checkpoints.py) read them from here.

    from prefillonly_sgl.models import guard_templates
    guard_templates.template_text("llama_guard_3_1b.jinja")
    guard_templates.spec("llama_guard_3")["template_categories"]["S1"]  # 'Violent Crimes.'
"""

from __future__ import annotations

import json
from importlib import resources

GUARDS = ("llama_guard_3", "qwen3guard_gen", "granite_guardian")
TEMPLATES = {
    "llama_guard_3_1b.jinja": "llama_guard_3",
    "llama_guard_3_8b.jinja": "llama_guard_3",
    "qwen3guard_gen.jinja": "qwen3guard_gen",
    "granite_guardian_3_0.jinja": "granite_guardian",
    "granite_guardian_3_1.jinja": "granite_guardian",
    "granite_guardian_3_3.documented.jinja": "granite_guardian",
}


def _read(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def template_text(name: str) -> str:
    """The template file `name` (a key of TEMPLATES), byte for byte."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown guard template {name!r}: expected one of {', '.join(TEMPLATES)}")
    return _read(name)


def spec(guard: str) -> dict:
    """The guard's .json: its templates (source, fidelity, keyword arguments), categories or
    risks with their codes and definitions, and its verdict format."""
    if guard not in GUARDS:
        raise ValueError(f"unknown guard {guard!r}: expected one of {', '.join(GUARDS)}")
    return json.loads(_read(f"{guard}.json"))
