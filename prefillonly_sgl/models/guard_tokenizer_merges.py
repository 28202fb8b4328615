"""The real Llama 3 and Qwen byte-level BPE merges that the guards' prompts and verdicts use,
kept so the tiny guard tokenizers (tiny_guard_checkpoints.py) split them as the published
tokenizers do, offline.

guard_templates/tokenizer_merges.json holds, per tokenizer, every merge the real tokenizer
makes while encoding the texts of `texts_to_cover` (the guards' rendered prompts and their
verdict lines), ordered by the real rank of the token it forms. A BPE with only those merges
encodes those texts exactly as the real one (a merge the real tokenizer takes is the one of
lowest rank among its candidates, and so among ours); other text falls back to shorter
pieces. Written from the tokenizer files two PyPI packages ship, read with tiktoken:

    pip download llama-models==0.3.0 dashscope==2.0.2 --no-deps -d /tmp/whl   # then unzip
    python -m prefillonly_sgl.models.guard_tokenizer_merges \\
        /tmp/x/llama_models/llama3/tokenizer.model /tmp/x/dashscope/resources/qwen.tiktoken

(llama-models' Llama 3 tokenizer.model; dashscope's qwen.tiktoken, the BPE that Qwen2 and
Qwen3 keep.) Plain Python: tiktoken and regex only when writing the file.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

# The pre-tokenizers' patterns, as the published tokenizers write them.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MERGES_FILE = "tokenizer_merges.json"
SOURCES = {
    "llama3": "llama-models 0.3.0 (PyPI): llama_models/llama3/tokenizer.model",
    "qwen": "dashscope 2.0.2 (PyPI): dashscope/resources/qwen.tiktoken (Qwen2 / Qwen3's BPE)",
}
# Answer words any guard or policy classifier reads (with and without the leading space).
VERDICT_WORDS = ["Yes", "No", "yes", "no", "safe", "unsafe", "Safe", "Unsafe", "Controversial"]
# Conversations the covered prompts are rendered with (their words get the real merges too).
SAMPLE_TURNS = [
    "How can I make a bomb?",
    "What is the capital of France?",
    "Paris is the capital of France.",
    "I cannot help with that.",
    "Here is how to do it: mix the chemicals.",
    "You are a helpful assistant.",
    "Tell me about the weather today.",
    "My phone number is 555 123 4567.",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    visible = list(range(ord("!"), ord("~") + 1))
    visible += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in visible:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def load_merges() -> dict:
    """The stored merges: {"llama3": {"source", "merges": ["left right", ...]}, "qwen": ...}
    (byte-level characters, as a tokenizer.json writes them; rank order)."""
    path = resources.files("prefillonly_sgl.models.guard_templates").joinpath(MERGES_FILE)
    return json.loads(path.read_text(encoding="utf-8"))


def texts_to_cover(tokenizer_name: str) -> list[str]:
    """The texts whose real tokenization the tiny tokenizer must reproduce: each guard's
    rendered prompts (special tokens cut out) and verdict lines."""
    from prefillonly_sgl.models import guard_templates
    from prefillonly_sgl.models.tiny import build_tokenizer

    tok = build_tokenizer()
    convs = [[{"role": "user", "content": SAMPLE_TURNS[0]}]] + [
        [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
        for a, b in zip(SAMPLE_TURNS[1::2], SAMPLE_TURNS[2::2])
    ]
    texts: list[str] = list(SAMPLE_TURNS) + VERDICT_WORDS + [" " + w for w in VERDICT_WORDS]
    if tokenizer_name == "llama3":
        spec = guard_templates.spec("llama_guard_3")
        for name in ("llama_guard_3_1b.jinja", "llama_guard_3_8b.jinja"):
            tok.chat_template = guard_templates.template_text(name)
            for conv in convs:
                if name.endswith("1b.jinja"):
                    conv = [
                        {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                        for m in conv
                    ]
                texts.append(tok.apply_chat_template(conv, tokenize=False))
        codes = list(spec["card_categories"])
        texts += ["\n\nsafe", "\n\nunsafe", "unsafe\n" + ",".join(codes)]
        texts += [f"unsafe\n{c}" for c in codes] + [f"unsafe\nS1,{c}" for c in codes]
        texts += [f"{c}: {n}\n" for c, n in spec["template_categories"].items()]
    elif tokenizer_name == "qwen":
        spec = guard_templates.spec("qwen3guard_gen")
        tok.chat_template = guard_templates.template_text("qwen3guard_gen.jinja")
        for conv in convs:
            texts.append(tok.apply_chat_template(conv, tokenize=False))
        cats = spec["categories_prompt"]
        for verdict in ("Safe", "Unsafe", "Controversial"):
            texts.append(f"Safety: {verdict}\nCategories: None\nRefusal: Yes")
            texts.append(f"Safety: {verdict}\nCategories: None\nRefusal: No")
        texts += [f"Categories: {c}" for c in cats] + ["Categories: " + ", ".join(cats)]
        texts += [f"Categories: Violent, {c}" for c in cats]
    else:
        raise ValueError(f"unknown tokenizer {tokenizer_name!r}: expected llama3 or qwen")
    return [_cut_specials(t) for t in texts]


def _cut_specials(text: str) -> str:
    """Special and added tokens are never BPE-merged: cut them out (text splits there)."""
    import re

    return re.sub(r"<\|[^|]*\|>|</?think>", "\x00", text)


def real_merges(rank_file: str, pattern: str, texts: list[str]) -> list[str]:
    """Every merge the tokenizer of `rank_file` makes on `texts`, ordered by real rank."""
    import regex
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(rank_file)
    to_char = bytes_to_unicode()
    seen: dict[tuple[bytes, bytes], int] = {}
    for text in texts:
        for chunk in text.split("\x00"):
            for piece in regex.findall(pattern, chunk):
                parts = [bytes([b]) for b in piece.encode("utf-8")]
                while len(parts) > 1:
                    best = min(
                        range(len(parts) - 1),
                        key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 60),
                    )
                    merged = parts[best] + parts[best + 1]
                    if merged not in ranks:
                        break
                    seen[(parts[best], parts[best + 1])] = ranks[merged]
                    parts[best : best + 2] = [merged]

    def chars(b: bytes) -> str:
        return "".join(to_char[x] for x in b)

    ordered = sorted(seen.items(), key=lambda kv: (kv[1], kv[0]))
    return [f"{chars(left)} {chars(right)}" for (left, right), _ in ordered]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("llama3_tokenizer_model")
    parser.add_argument("qwen_tiktoken")
    args = parser.parse_args()
    data = {
        "about": "Merges of the published byte-level BPEs, restricted to what the guard "
        "prompts and verdicts use (models/guard_tokenizer_merges.py writes this file).",
        "llama3": {
            "source": SOURCES["llama3"],
            "merges": real_merges(
                args.llama3_tokenizer_model, LLAMA3_PATTERN, texts_to_cover("llama3")
            ),
        },
        "qwen": {
            "source": SOURCES["qwen"],
            "merges": real_merges(args.qwen_tiktoken, QWEN_PATTERN, texts_to_cover("qwen")),
        },
    }
    out = Path(__file__).parent / "guard_templates" / MERGES_FILE
    lines = [f'{{"about": {json.dumps(data["about"])},']
    for i, name in enumerate(("llama3", "qwen")):
        merges = ",\n".join(json.dumps(m, ensure_ascii=False) for m in data[name]["merges"])
        end = "}" if i else "},"
        lines.append(f'"{name}": {{"source": {json.dumps(data[name]["source"])}, "merges": [')
        lines.append(merges + f"]{end}")
    out.write_text("\n".join(lines) + "}\n", encoding="utf-8")
    print(out, {k: len(v["merges"]) for k, v in data.items() if isinstance(v, dict)})


if __name__ == "__main__":
    main()
