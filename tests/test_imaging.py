"""Image metrics, the structure verdict, PSNR and image-check on generated images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omniprobe.classify.imaging import (
    ImageMismatch,
    UnreadableImage,
    decode_pixels,
    flat_fraction,
    load_pixels,
    measure,
    pixels_sha256,
    psnr,
    structure_reasons,
    to_pixels,
)
from omniprobe.cli import main
from omniprobe.config.hosts import load_hosts
from omniprobe.config.report_settings import StructureChecks
from omniprobe.errors import InputError

from .synthetic import broken_signature, natural, perturbed, save, textbook_psnr

ROOT = Path(__file__).resolve().parents[1]
CONFIGURED = load_hosts(ROOT / "hosts.toml").structure


def pixels(array: np.ndarray, name: str = "img", mode: str | None = None):
    return to_pixels(Image.fromarray(array, mode) if mode else Image.fromarray(array), name)


# --- the structure verdict, calibrated on the seed report ------------------------------------


@pytest.mark.parametrize("opaque", [0.008, 0.02, 0.035])
def test_the_reports_fp8_signature_is_broken(opaque):
    m = measure(pixels(broken_signature(opaque)), CONFIGURED)
    assert m.opaque_fraction == pytest.approx(opaque, abs=1e-3)
    assert m.alpha_mean == pytest.approx(115, abs=2)
    assert 120 <= m.rgb_mean <= 130
    assert m.verdict == "broken"
    assert any("opaque fraction" in r for r in m.reasons)


def test_a_fully_opaque_natural_image_is_sound():
    m = measure(pixels(natural()), CONFIGURED)
    assert (m.opaque_fraction, m.alpha_mean) == (1.0, 255.0)
    assert m.flatness < 0.5
    assert (m.verdict, m.reasons) == ("sound", [])


def test_hosts_toml_states_the_documented_defaults():
    assert StructureChecks() == CONFIGURED


@pytest.mark.parametrize(("opaque", "flatness", "rgb_std", "broken_by"), [
    (1.0, 0.0, 60.0, []),
    (0.9, 0.98, 16.0, []),
    (0.899, 0.0, 60.0, ["opaque"]),
    (0.035, 0.0, 60.0, ["opaque"]),
    (1.0, 0.99, 60.0, ["flatness"]),
    (1.0, 0.0, 15.9, ["RGB"]),          # near-flat: the collapse without alpha (issue 23)
    (0.0, 1.0, 0.0, ["opaque", "flatness", "RGB"]),
])
def test_structure_reasons(opaque, flatness, rgb_std, broken_by):
    reasons = structure_reasons(opaque, flatness, rgb_std, StructureChecks())
    assert [r.split()[0] for r in reasons] == broken_by


def grey_noise_rgb(mean: float, std: float, per_channel: bool = False,
                   shape: tuple[int, int] = (208, 312), seed: int = 3) -> np.ndarray:
    """The seed's collapse as an RGB output shows it: near-flat grey noise around `mean`, one
    draw for R, G and B (grey) or one each (grey-ish)."""
    rng = np.random.default_rng(seed)
    draw = rng.normal(mean, std, (*shape, 3 if per_channel else 1))
    return np.clip(draw, 0, 255).round().astype(np.uint8).repeat(1 if per_channel else 3, -1)


def photograph(name: str) -> np.ndarray:
    """A natural photograph scikit-image ships, as RGB."""
    data = pytest.importorskip("skimage.data", reason="scikit-image is a test dependency")
    image = getattr(data, name)()
    return np.stack([image] * 3, -1) if image.ndim == 2 else image[..., :3]


@pytest.mark.parametrize(("image", "verdict"), [
    # The seed's signature rendered without alpha: opacity cannot see it, nor flatness (no
    # 8x8 tile of grey noise spans 2 levels or fewer); its near-flatness can (issue 23).
    (lambda: grey_noise_rgb(125, 4), "broken"),
    (lambda: grey_noise_rgb(120, 6), "broken"),
    (lambda: grey_noise_rgb(130, 10, per_channel=True), "broken"),
    (lambda: grey_noise_rgb(125, 15), "broken"),
    (lambda: broken_signature()[..., :3], "broken"),  # the RGBA signature's own RGB
    # Natural photographs, in colour and grey, and the smooth picture of synthetic.natural.
    (lambda: photograph("astronaut"), "sound"),
    (lambda: photograph("chelsea"), "sound"),
    (lambda: photograph("coffee"), "sound"),
    (lambda: photograph("camera"), "sound"),
    (lambda: photograph("rocket"), "sound"),
    (lambda: natural()[..., :3], "sound"),
])
def test_the_structure_gate_on_rgb_outputs(image, verdict):
    array = image()
    m = measure(pixels(array), CONFIGURED)
    assert m.mode == "RGB" and m.opaque_fraction == 1.0
    assert m.verdict == verdict, m.reasons
    if verdict == "broken":
        assert m.flatness <= CONFIGURED.max_flat_fraction  # flatness alone would pass it
        assert [r for r in m.reasons if r.endswith("near-flat")] and 115 <= m.rgb_mean <= 135


@pytest.mark.parametrize("colour", [(0, 0, 0, 255), (128, 128, 128, 255), (255, 255, 255, 255)])
def test_a_blank_opaque_image_is_broken_by_flatness(colour):
    m = measure(to_pixels(Image.new("RGBA", (64, 48), colour), "blank"), CONFIGURED)
    assert (m.opaque_fraction, m.flatness, m.rgb_std) == (1.0, 1.0, 0.0)
    assert m.verdict == "broken" and "blank" in m.reasons[0]


def test_metrics_match_direct_numpy_figures():
    rgba = broken_signature(0.2, alpha_mean=150, seed=3)
    m = measure(pixels(rgba), StructureChecks(opaque_alpha=200))
    rgb = rgba[..., :3].astype(np.float64)
    assert m.opaque_fraction == pytest.approx(np.mean(rgba[..., 3] >= 200), abs=1e-12)
    assert m.alpha_mean == pytest.approx(rgba[..., 3].mean(), abs=1e-9)
    assert m.rgb_mean == pytest.approx(rgb.mean(), abs=1e-9)
    assert m.rgb_std == pytest.approx(rgb.std(), abs=1e-9)


def _flat_reference(rgb: np.ndarray, tile: int, tolerance: int) -> float:
    h, w = rgb.shape[:2]
    sh, sw = min(tile, h), min(tile, w)
    flags = [np.ptp(rgb[i:i + sh, j:j + sw].astype(int), axis=(0, 1)).max() <= tolerance
             for i in range(0, h // sh * sh, sh) for j in range(0, w // sw * sw, sw)]
    return sum(flags) / len(flags)


@pytest.mark.parametrize(("shape", "tile", "tolerance"), [
    ((64, 64), 8, 2),
    ((37, 53), 8, 3),   # remainders left out
    ((5, 90), 8, 3),    # shorter than one tile: one row of tiles
    ((3, 3), 8, 255),   # smaller than a tile: one tile
    ((48, 40), 4, 1),
])
def test_flatness_matches_a_tile_by_tile_reference(shape, tile, tolerance):
    rng = np.random.default_rng(sum(shape))
    rgba = rng.integers(0, 3, (*shape, 4), dtype=np.uint8)  # mostly flat at tolerance >= 2
    rgba[: shape[0] // 2, : shape[1] // 2] = rng.integers(0, 255, (shape[0] // 2, shape[1] // 2, 4))
    rgba[..., 3] = rng.integers(0, 256, shape)  # alpha noise: flatness is about colour alone
    expected = _flat_reference(rgba[..., :3], tile, tolerance)
    assert flat_fraction(rgba, tile, tolerance) == pytest.approx(expected)
    assert flat_fraction(rgba.astype(np.uint16) * 257, tile, tolerance * 257) == pytest.approx(
        expected)
    assert 0 <= expected <= 1


# --- modes and their conversion rules --------------------------------------------------------


def _palette(transparent_index: int | None) -> Image.Image:
    img = Image.fromarray(np.array([[0, 1, 2], [2, 1, 0]], np.uint8), "L").convert("P")
    img.putpalette([10, 20, 30, 40, 50, 60, 70, 80, 90])
    if transparent_index is not None:
        img.info["transparency"] = transparent_index
    return img


GREY = np.array([[0, 100], [200, 255]], np.uint8)
CONVERSIONS = [
    ("L", lambda: Image.fromarray(GREY, "L"),
     np.dstack([GREY, GREY, GREY, np.full_like(GREY, 255)])),
    ("LA", lambda: Image.fromarray(np.dstack([GREY, GREY[::-1]]), "LA"),
     np.dstack([GREY, GREY, GREY, GREY[::-1]])),
    ("1", lambda: Image.fromarray(GREY > 150).convert("1"),
     np.dstack([np.where(GREY > 150, 255, 0).astype(np.uint8)] * 3 + [np.full_like(GREY, 255)])),
    ("RGB", lambda: Image.fromarray(np.dstack([GREY, GREY // 2, GREY // 3]), "RGB"),
     np.dstack([GREY, GREY // 2, GREY // 3, np.full_like(GREY, 255)])),
    ("P", lambda: _palette(None),
     np.array([[[10, 20, 30, 255], [40, 50, 60, 255], [70, 80, 90, 255]],
               [[70, 80, 90, 255], [40, 50, 60, 255], [10, 20, 30, 255]]], np.uint8)),
    ("P", lambda: _palette(1),
     np.array([[[10, 20, 30, 255], [40, 50, 60, 0], [70, 80, 90, 255]],
               [[70, 80, 90, 255], [40, 50, 60, 0], [10, 20, 30, 255]]], np.uint8)),
]


@pytest.mark.parametrize(("mode", "make", "expected"), CONVERSIONS,
                         ids=["L", "LA", "1", "RGB", "P", "P-transparent"])
def test_eight_bit_modes_convert_by_the_documented_rules(mode, make, expected):
    px = to_pixels(make(), "x")
    assert px.mode == mode and px.peak == 255 and px.rgba.dtype == np.uint8
    np.testing.assert_array_equal(px.rgba, expected)


SIXTEEN = np.array([[0, 257 * 100], [257 * 200, 65535]], np.uint16)


def _grey_rgba16(grey: np.ndarray) -> np.ndarray:
    return np.dstack([grey] * 3 + [np.full_like(grey, 65535)])


@pytest.mark.parametrize("make", [
    lambda: Image.fromarray(SIXTEEN),                       # I;16
    lambda: Image.frombytes("I;16B", (2, 2), SIXTEEN.astype(">u2").tobytes()),
    lambda: Image.fromarray(SIXTEEN.astype(np.int32)),      # I, as older Pillow opens 16-bit PNG
], ids=["I;16", "I;16B", "I"])
def test_sixteen_bit_grey_keeps_its_depth(make):
    px = to_pixels(make(), "x")
    assert px.mode == "I;16" and px.peak == 65535
    np.testing.assert_array_equal(px.rgba, _grey_rgba16(SIXTEEN))


def test_sixteen_bit_figures_are_on_the_eight_bit_scale():
    grey = np.random.default_rng(0).integers(0, 256, (40, 56), dtype=np.uint8)
    eight = measure(to_pixels(Image.fromarray(grey, "L"), "a"), StructureChecks())
    wide = Image.fromarray(grey.astype(np.uint16) * 257)
    sixteen = measure(to_pixels(wide, "b"), StructureChecks())
    assert sixteen.mode == "I;16"
    assert sixteen.reasons == eight.reasons
    figures = {"mode", "reasons"}
    assert sixteen.model_dump(exclude=figures) == pytest.approx(eight.model_dump(exclude=figures))


def test_files_decode_like_images_in_memory(tmp_path):
    cases = {"p.png": _palette(1), "g16.png": Image.fromarray(SIXTEEN),
             "la.png": Image.fromarray(np.dstack([GREY, GREY[::-1]]), "LA")}
    for name, img in cases.items():
        img.save(tmp_path / name)
        np.testing.assert_array_equal(load_pixels(tmp_path / name).rgba, to_pixels(img, name).rgba)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Image.new("F", (4, 4)), "image mode 'F' is not supported"),
    (lambda: Image.fromarray(np.array([[70000]], np.int32)), "outside the 16-bit range"),
    (lambda: Image.new("RGB", (0, 3)), "no pixels"),
])
def test_unsupported_images_are_refused_by_name(make, message):
    with pytest.raises(UnreadableImage) as err:
        to_pixels(make(), "odd.tif")
    assert "odd.tif" in str(err.value) and message in str(err.value)


def test_unreadable_files_name_the_file_and_the_reason(tmp_path):
    Image.fromarray(natural()).save(tmp_path / "good.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "good.png").read_bytes()[:2000])
    (tmp_path / "notes.png").write_text("not an image")
    for name, reason in [("missing.png", "file not found"), ("cut.png", "cannot read or decode"),
                         ("notes.png", "not an image")]:
        with pytest.raises(UnreadableImage) as err:
            load_pixels(tmp_path / name)
        assert str(err.value).startswith(str(tmp_path / name)) and reason in str(err.value)


def test_bytes_decode_as_their_file_does_and_garbage_is_named(tmp_path):
    Image.fromarray(natural()).save(tmp_path / "good.png")
    data = (tmp_path / "good.png").read_bytes()
    np.testing.assert_array_equal(decode_pixels(data, "answer").rgba,
                                  load_pixels(tmp_path / "good.png").rgba)
    for garbage, reason in [(data[:2000], "cannot read or decode"),
                            (b"\x89PNG but not really", "not an image")]:
        with pytest.raises(UnreadableImage) as err:
            decode_pixels(garbage, "answer")
        assert str(err.value).startswith("answer: ") and reason in str(err.value)


# --- PSNR ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("comparator", ["rgba", "rgb"])
def test_psnr_matches_the_textbook_formula(seed, comparator):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (61, 47, 4), dtype=np.uint8)
    b = np.clip(a + rng.normal(0, 10 + 20 * seed, a.shape), 0, 255).astype(np.uint8)
    channels = slice(None) if comparator == "rgba" else slice(0, 3)
    expected = textbook_psnr(a[..., channels], b[..., channels], data_range=255)
    got = psnr(pixels(a), pixels(b), comparator)
    assert abs(got.db - expected) < 1e-6
    assert not got.identical


def test_psnr_16_bit_and_an_explicit_data_range_match_the_textbook_formula():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 65536, (30, 40), dtype=np.uint16)
    b = rng.integers(0, 65536, (30, 40), dtype=np.uint16)
    pa, pb = pixels(a), pixels(b)
    assert psnr(pa, pb).data_range == 65535
    assert abs(psnr(pa, pb).db
               - textbook_psnr(_grey_rgba16(a), _grey_rgba16(b), data_range=65535)) < 1e-6
    assert abs(psnr(pa, pb, "rgb", data_range=70000).db
               - textbook_psnr(a, b, data_range=70000)) < 1e-6


def test_identical_images_are_reported_as_identical_and_json_safe():
    img = natural((32, 48))
    result = psnr(pixels(img, "a"), pixels(img.copy(), "b"))
    assert (result.identical, result.db, result.mse) == (True, None, 0.0)
    assert json.loads(json.dumps(result.as_json(), allow_nan=False))["identical"] is True


def test_a_size_mismatch_names_both_files_and_sizes():
    with pytest.raises(ImageMismatch) as err:
        psnr(pixels(natural((20, 30)), "out.png"), pixels(natural((20, 31)), "base.png"))
    text = str(err.value)
    assert "out.png" in text and "base.png" in text and "30x20" in text and "31x20" in text


@pytest.mark.parametrize(("a", "b", "modes"), [
    (lambda: Image.fromarray(natural()[..., :3]), lambda: Image.fromarray(natural()),
     ("RGB", "RGBA")),
    (lambda: Image.fromarray(GREY, "L"), lambda: Image.fromarray(GREY.astype(np.uint16) * 257),
     ("L", "I;16")),
])
def test_a_mode_mismatch_is_an_error_unless_conversion_is_asked_for(a, b, modes):
    pa, pb = to_pixels(a(), "out.png"), to_pixels(b(), "base.png")
    with pytest.raises(ImageMismatch) as err:
        psnr(pa, pb)
    text = str(err.value)
    assert "out.png" in text and "base.png" in text
    assert f"mode {modes[0]} differs from {modes[1]}" in text
    assert isinstance(err.value, InputError)
    # The same pixels under the documented conversion rules: identical, at the wider depth.
    converted = psnr(pa, pb, convert_modes=True)
    assert converted.identical and converted.data_range == (255 if modes[1] == "RGBA" else 65535)


def test_psnr_drops_with_the_noise():
    base = natural()
    values = [psnr(pixels(base), pixels(perturbed(base, s))).db for s in (2, 8, 32)]
    assert values == sorted(values, reverse=True) and values[-1] < values[0] - 10


# --- pixel hash ----------------------------------------------------------------------------


def test_pixel_hash_follows_pixels_not_encoding():
    img = natural((24, 36))
    as_rgb = to_pixels(Image.fromarray(img[..., :3]), "a")
    as_rgba = to_pixels(Image.fromarray(img), "b")
    changed = img.copy()
    changed[0, 0, 0] ^= 1
    assert pixels_sha256(as_rgb) == pixels_sha256(as_rgba)
    assert pixels_sha256(pixels(changed)) != pixels_sha256(as_rgba)
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert pixels_sha256(pixels(grey)) != pixels_sha256(pixels(grey.astype(np.uint16) * 257))


# --- omniprobe image-check -----------------------------------------------------------------


@pytest.fixture
def outside_project(tmp_path, monkeypatch):
    """A working folder with no hosts.toml above it: image-check uses the built-in defaults."""
    monkeypatch.delenv("OMNIPROBE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_image_check_table_and_exit_1_on_a_broken_image(outside_project, capsys):
    save(outside_project / "out" / "bf16" / "2301.png", natural())
    save(outside_project / "out" / "fp8" / "2301.webp", broken_signature(), lossless=True)
    (outside_project / "out" / "notes.txt").write_text("skipped: not an image suffix")
    assert main(["image-check", "out"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["image", "mode", "size"]
    assert "sound" in lines[1] and "bf16" in lines[1]
    assert "broken (opaque fraction" in lines[2] and "fp8" in lines[2]
    assert lines[-1] == "thresholds: built-in defaults (no hosts.toml found)"


def test_image_check_json_and_exit_0_when_all_sound(outside_project, capsys):
    path = save(outside_project / "a.png", natural())
    assert main(["image-check", "--json", str(path)]) == 0
    payload = json.loads(capsys.readouterr().out)
    (image,) = payload["images"]
    assert (image["path"], image["verdict"], image["opaque_fraction"]) == (str(path), "sound", 1.0)
    assert payload["unreadable"] == [] and payload["thresholds"]["min_opaque_fraction"] == 0.9


def test_image_check_uses_the_projects_thresholds(outside_project, monkeypatch, capsys):
    monkeypatch.setenv("OMNIPROBE_ROOT", str(ROOT))
    save(outside_project / "a.png", broken_signature())
    assert main(["image-check", "--json", "a.png"]) == 1
    assert json.loads(capsys.readouterr().out)["thresholds_from"].endswith("hosts.toml [structure]")


@pytest.mark.parametrize(("setup", "message"), [
    (lambda d: d / "missing.png", "no such file or folder"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "folder holds no"),
    (lambda d: (d / "bad.png").write_text("x") and d / "bad.png", "not an image"),
])
def test_image_check_exits_2_on_unreadable_input(outside_project, capsys, setup, message):
    good = save(outside_project / "good.png", natural())
    target = setup(outside_project)
    assert main(["image-check", str(good), str(target)]) == 2
    captured = capsys.readouterr()
    assert f"error: {target}: {message}" in captured.err
    assert "good.png" in captured.out  # the readable image is still reported
