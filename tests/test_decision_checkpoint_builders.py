"""The tiny decision checkpoints (models/tiny_decision_checkpoints.py): each folder has the files
SGLang 0.5.23's loaders read, and those loaders accept them (no server started; serving
each kind on /v1/systemone was checked by hand, see the module's docstring)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoTokenizer

from prefillonly_sgl.models.tiny_decision_checkpoints import (
    DECIDER_CODES,
    KEV_DELIMITERS,
    build_decision_checkpoint,
)

HIDDEN = 64  # models/families.py's tiny width


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decision-checkpoints")
    kinds = ("decider", "decider_noncausal", "clef", "kev")
    return {kind: build_decision_checkpoint(kind, root / kind) for kind in kinds}


def _config(path) -> dict:
    return json.loads((path / "config.json").read_text())


def _weight_names(path) -> set[str]:
    with safe_open(path / "model.safetensors", "pt") as f:
        return set(f.keys())


def test_decider_is_a_bare_backbone_with_a_readout(folders):
    from sglang.srt.configs.model_config import load_decision_config

    path = folders["decider"]
    assert _config(path)["architectures"] == ["Qwen3_5Model"]
    names = _weight_names(path)
    assert not any(n.startswith("lm_head") for n in names)  # SGLang fills it from the readout
    assert {n.split(".")[0] for n in names} == {"language_model", "visual"}
    # The index names only the backbone's file, so SGLang does not read the readout as
    # model weights.
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {n: "model.safetensors" for n in names}

    config = load_decision_config(str(path), None)
    assert config["codes"] == DECIDER_CODES and config["attention_mode"] == "causal"
    assert config["pooling"] == "last" and config["temperature"] > 0
    readout = load_file(path / "readout.safetensors")["weight"]
    assert readout.dtype == torch.float32 and readout.shape == (len(DECIDER_CODES), HIDDEN)
    # Each code is one token after the chat prompt's last line, the id the readout names.
    tok = AutoTokenizer.from_pretrained(path)
    newline = tok.encode("\n", add_special_tokens=False)
    for code, token_id in zip(config["codes"], config["token_ids"]):
        assert tok.encode("\n" + code, add_special_tokens=False) == newline + [token_id]
    assert len(set(config["token_ids"])) == len(DECIDER_CODES)


def test_noncausal_decider_differs_in_its_attention_mode_only(folders):
    from sglang.srt.configs.model_config import NONCAUSAL_FULL_ATTENTION, load_decision_config

    causal, noncausal = folders["decider"], folders["decider_noncausal"]
    assert load_decision_config(str(noncausal), None)["attention_mode"] == (
        NONCAUSAL_FULL_ATTENTION
    )
    for name in ("model.safetensors", "readout.safetensors", "config.json"):
        assert (causal / name).read_bytes() == (noncausal / name).read_bytes(), name
    # A full-attention layer before the last one, so the mode changes the last position.
    layer_types = _config(noncausal)["text_config"]["layer_types"]
    assert "full_attention" in layer_types[:-1]


def test_clef_head_loads_into_sglangs_joint_schema_head(folders):
    from sglang.srt.configs.model_config import load_joint_head_config
    from sglang.srt.layers.joint_schema_head import JointSchemaHead

    path = folders["clef"]
    assert _config(path)["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert "lm_head.weight" in _weight_names(path)  # the head's lexical prior reads it
    config = load_joint_head_config(str(path), None)
    assert config["hidden_size"] == HIDDEN
    head = JointSchemaHead(**config)
    state = load_file(path / "joint_head.safetensors")
    head.load_state_dict(state, strict=True)  # what SGLang's _load_joint_head does
    for name in ("prior_logit_scale", "joint_logit_scale", "residual_gate"):
        assert state[name].item() != 0.0, name  # zero by default: every term must count
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model.safetensors"}


def test_kev_head_loads_into_sglangs_pointer_head(folders):
    from sglang.srt.configs.model_config import load_pointer_head
    from sglang.srt.layers.pointer_head import PointerPooler

    path = folders["kev"]
    assert _config(path)["architectures"] == ["Qwen3_5TextModel"]
    names = _weight_names(path)
    # Kev's own names, handed to SGLang's text body as they are: no prefix, no LM head.
    assert {n.split(".")[0] for n in names} == {"embed_tokens", "layers", "norm"}
    meta = load_pointer_head(str(path), None)
    assert meta["weights_dtype"] == "fp32" and meta["temperature"] > 0
    pooler = PointerPooler(HIDDEN, meta)
    pooler.load_state_dict(meta["head"], strict=True)  # what SGLang's loader does
    assert pooler.q.weight.shape == (meta["head_dim"], HIDDEN)


def test_kev_tokenizer_has_each_delimiter_as_one_token(folders):
    tok = AutoTokenizer.from_pretrained(folders["kev"])
    ids = [tok.convert_tokens_to_ids(t) for t in KEV_DELIMITERS]
    assert len(set(ids)) == len(KEV_DELIMITERS) and tok.unk_token_id not in ids
    for token, token_id in zip(KEV_DELIMITERS, ids):
        assert tok.encode(token, add_special_tokens=False) == [token_id]
        # Inside text too, as kev.py's prompt joins them with encoded pieces.
        assert token_id in tok.encode(f"state{token}more", add_special_tokens=False)


def test_a_folder_built_twice_is_identical(folders, tmp_path):
    again = build_decision_checkpoint("kev", tmp_path / "kev")
    first = sorted(p.name for p in folders["kev"].iterdir())
    assert sorted(p.name for p in again.iterdir()) == first
    for name in first:
        assert (again / name).read_bytes() == (folders["kev"] / name).read_bytes(), name


def test_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown kind"):
        build_decision_checkpoint("nope", tmp_path)
