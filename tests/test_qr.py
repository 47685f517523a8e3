"""eagleviz/app/qr.py: the room link's QR code, read back by an independent decoder (zxing-cpp) at every version
it makes, and its Reed-Solomon codewords against the standard's worked example."""

from __future__ import annotations

import base64
import random
import string

import pytest

from eagleviz.app import qr


def test_reed_solomon_matches_the_worked_example():
    """ "HELLO WORLD" at version 1-M: its 16 data codewords give these 10 error-correction codewords."""
    data = [32, 91, 11, 120, 209, 114, 220, 77, 67, 64, 236, 17, 236, 17, 236, 17]
    assert qr._remainder(data, qr._divisor(10)) == [196, 35, 39, 119, 235, 215, 231, 226, 93, 23]


def test_the_block_tables_add_up_to_each_versions_codewords():
    total = {1: 26, 2: 44, 3: 70, 4: 100, 5: 134, 6: 172, 7: 196, 8: 242, 9: 292, 10: 346}
    for version, (ec, groups) in qr.BLOCKS.items():
        assert sum(n * (size + ec) for n, size in groups) == total[version]
    assert [qr.capacity(v) for v in (1, 5, 10)] == [14, 84, 213]


def _image(text: str):
    np = pytest.importorskip("numpy")
    rows = qr.matrix(text)
    n = len(rows) + 2 * qr.QUIET
    pixels = np.full((n, n), 255, np.uint8)
    for y, row in enumerate(rows):
        for x, dark in enumerate(row):
            if dark:
                pixels[y + qr.QUIET, x + qr.QUIET] = 0
    return np.kron(pixels, np.ones((4, 4), np.uint8))


def test_every_version_reads_back_as_its_text():
    zxing = pytest.importorskip("zxingcpp", reason="zxing-cpp (the test extra) decodes the symbols")
    rng = random.Random(0)
    texts = ["http://127.0.0.1:7860/?room=ABCDE", "https://example-space.hf.space/?room=KMNPQ", "é \u2192 \U0001f985"]
    for version in range(1, 11):   # the longest and a random length of each version
        low = qr.capacity(version - 1) + 1 if version > 1 else 1
        for n in (qr.capacity(version), rng.randint(low, qr.capacity(version))):
            texts.append("".join(rng.choice(string.ascii_letters + string.digits + ":/?=.-") for _ in range(n)))
    for text in texts:
        read = zxing.read_barcodes(_image(text))
        assert [r.text for r in read] == [text], text
    assert len(qr.matrix("x" * qr.capacity(10))) == 57   # version 10: 17 + 4 * 10 modules a side


def test_too_long_a_text_is_refused_and_a_drawing_is_an_svg_image():
    with pytest.raises(ValueError, match="213 at most"):
        qr.matrix("x" * 214)
    uri = qr.data_uri("http://127.0.0.1:7860/?room=ABCDE")
    svg = base64.b64decode(uri.removeprefix("data:image/svg+xml;base64,")).decode()
    assert svg.startswith("<svg") and 'viewBox="0 0 37 37"' in svg   # version 3 (29 modules) and the quiet zone
