"""Images given to a scoring call, loaded and checked before SGLang sees them
(scoring/images.py): URLs fetched from a real HTTP server on localhost, data URLs, bytes,
PIL images, paths for the Python API only; every bad one a clear error naming it."""

from __future__ import annotations

import base64
import io

import pytest
from file_server import serving
from PIL import Image

from prefillonly_sgl.machine.ports import free_port
from prefillonly_sgl.scoring import images
from prefillonly_sgl.scoring.errors import InvalidRequestError


def _png(size=(32, 32), mode="RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, color=1 if mode == "1" else (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def image_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    (folder / "red.png").write_bytes(_png())
    (folder / "broken.png").write_bytes(b"not an image at all")

    with serving(folder) as url:
        yield url, folder


def test_every_form_of_an_image_becomes_the_same_bytes(image_server, tmp_path):
    url, folder = image_server
    png = _png()
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    assert images.load_image(f"{url}/red.png", "images[0]") == png
    assert images.load_image(data_url, "images[0]") == png
    assert images.load_image({"url": data_url}, "images[0]") == png  # OpenAI's image_url
    assert images.load_image(png, "images[0]") == png
    assert images.check_decodes(images.load_image(Image.open(io.BytesIO(png)), "x"), "x") == (
        32,
        32,
    )
    path = folder / "red.png"
    assert images.load_image(str(path), "x", allow_paths=True) == png
    assert images.load_image(path.as_uri(), "x", allow_paths=True) == png


@pytest.mark.parametrize(
    "value, problem",
    [
        ("{url}/missing.png", "images\\[2\\]: fetching .* answered HTTP 404"),
        ("http://127.0.0.1:{dead}/a.png", "images\\[2\\]: cannot fetch"),
        ("{url}/broken.png", "images\\[2\\]: not a decodable image"),
        ("data:image/png;base64,@@@@", "base64 does not decode"),
        ("data:image/png,raw", "data:<type>;base64"),
        ("/etc/passwd", "an http\\(s\\) URL or a data URL"),  # a server never reads its files
        ("file:///etc/passwd", "an http\\(s\\) URL or a data URL"),
        (12, "got int"),
    ],
)
def test_a_bad_image_is_named(image_server, value, problem):
    url, _ = image_server
    if isinstance(value, str):
        value = value.format(url=url, dead=free_port())
    with pytest.raises(InvalidRequestError, match=problem):
        images.load_image(value, "images[2]")


def test_limits_refuse_a_bomb_a_huge_file_and_too_many(monkeypatch, tmp_path):
    bomb = _png((5000, 4000), mode="1")  # 20M pixels in a few kilobytes
    assert len(bomb) < 100_000
    with pytest.raises(InvalidRequestError, match="5000x4000 pixels"):
        images.load_image(bomb, "items[1].image")
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 40)  # a 32x32 one-colour PNG: ~90 bytes
    with pytest.raises(InvalidRequestError, match="over the 40"):
        images.load_image(_png(), "images[0]")
    with pytest.raises(InvalidRequestError, match="at most 16 images"):
        images.check_count(17)
    with pytest.raises(InvalidRequestError, match="cannot read"):
        images.load_image(str(tmp_path / "none.png"), "images[0]", allow_paths=True)


def test_gemma3_images_are_refused_where_sglang_runs_them_causally():
    from prefillonly_sgl.scoring.image_prompts import image_refusal

    why = image_refusal(["Gemma3ForConditionalGeneration"], "torch_native")
    assert why is not None and "bidirectionally" in why and "torch_native" in why
    assert image_refusal(["Gemma3ForConditionalGeneration"], "triton") is None
    assert image_refusal(["Qwen2_5_VLForConditionalGeneration"], "torch_native") is None
