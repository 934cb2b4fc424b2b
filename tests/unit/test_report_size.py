"""The report of the default sweep stays small (it was 3.0 MB on an H100, 2.4 MB of it figures in base64) and its
figures stay vector drawings a browser shows."""

import re
import shutil
import subprocess
import urllib.parse
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from results_fixtures import DEFAULT_SWEEP_RUN, cli, make_default_sweep_run

from attnbench.report import plots

LIMIT = 2_000_000
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    assert make_default_sweep_run(folder / "r.db") == 736
    res = cli("report", "--db", folder / "r.db", "--run", DEFAULT_SWEEP_RUN, "-o", folder / "report.html")
    assert res.returncode == 0, res.stderr
    return folder / "report.html"


def figures_of(text: str) -> list[str]:
    """The SVG documents of the report's figures, decoded from their data URIs."""
    uris = re.findall(r'<img alt="[^"]*" src="(data:image/svg\+xml,[^"]*)">', text)
    return [urllib.parse.unquote(uri.removeprefix("data:image/svg+xml,")) for uri in uris]


@pytest.mark.slow
def test_the_default_sweeps_report_is_under_2_mb_with_every_figure(report):
    text = report.read_text()
    size = len(text.encode())
    svgs = figures_of(text)
    assert size <= LIMIT, f"{size / 1e6:.2f} MB"
    # exact kernels (2 figures of at most 9 lines), approximate ones, API forms; TFLOP/s, ms and memory
    assert len(svgs) == text.count("<figure>") == 12
    assert "base64" not in text
    for svg in svgs:
        root = ET.fromstring(svg)  # each a well-formed SVG document
        assert root.tag == f"{SVG}svg"
        texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
        assert {plots.X_AXES["seq_len"][1], plots.X_AXES["sparsity"][1]} & set(texts)  # text as text, drawn sharp
        assert len(list(root.iter(f"{SVG}path"))) > 20  # lines, markers, axes: a vector drawing, no bitmap
        assert not list(root.iter(f"{SVG}image"))


def test_compact_svg_keeps_the_drawing():
    """The compact SVG holds the same elements, coordinates within a twentieth of a point."""
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.plot([1, 2, 3], [0.123456, 2.5, 1.75], marker="o", label="fa3 ≈")
    ax.set_title("it's \"quoted\" & <escaped>")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")
    original = buf.getvalue().decode()
    compact = plots.compact_svg(original)
    assert len(compact) < 0.9 * len(original)
    assert "<metadata>" in original and "<metadata>" not in compact  # the one part left out
    a, b = ET.fromstring(re.sub(r"<metadata>.*?</metadata>", "", original, flags=re.S)), ET.fromstring(compact)
    assert [e.tag for e in a.iter()] == [e.tag for e in b.iter()]
    numbers = re.compile(r"-?\d+(?:\.\d+)?")
    for x, y in zip(a.iter(), b.iter()):
        for key in ("d", "x", "y"):
            if key in x.attrib:
                assert np.allclose([float(n) for n in numbers.findall(x.attrib[key])],
                                   [float(n) for n in numbers.findall(y.attrib[key])], atol=0.05)
        assert (x.text or "").strip() == (y.text or "").strip()
    from attnbench.report.html import svg_uri
    uri = svg_uri(compact.encode())
    assert '"' not in uri and "#" not in uri and "&" not in uri  # fits in a double-quoted attribute as it is
    assert urllib.parse.unquote(uri.removeprefix("data:image/svg+xml,")).replace("'", '"') == \
        compact.replace("'", '"')


@pytest.mark.slow
def test_the_figures_draw_in_chromium(report, tmp_path):
    """A figure of the report, alone on a page, in headless Chromium: its coloured lines are there."""
    binary = next((p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))), None)
    if binary is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); .ci/run installs it")
    figure = re.search(r"<figure>.*?</figure>", report.read_text())[0]
    page = tmp_path / "figure.html"
    page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">'
                    f'<div style="width:1200px">{figure.replace("<img ", "<img style=width:100% ")}</div></body></html>')
    shot = tmp_path / "shot.png"
    subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,1100",
                    page.as_uri()], capture_output=True, timeout=120)
    import matplotlib.image

    pixels = np.asarray(matplotlib.image.imread(shot))[..., :3]
    saturated = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.3  # the backends' colours, not grey text or axes
    assert saturated.mean() > 0.003, "no coloured lines: the figure did not draw"
    assert (pixels.mean(axis=2) < 0.3).mean() > 0.002, "no dark pixels: no text or axes"
