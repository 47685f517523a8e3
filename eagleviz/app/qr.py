"""A QR code of a room's link, for a projector: students scan it instead of typing the address.

ISO/IEC 18004 in byte mode at error-correction level M (15% of the symbol can be lost), versions 1 to 10 (up to
213 bytes: any page address with `?room=CODE`), written here so the page needs no other package and no network:

    data       mode 0100, the byte count (8 bits, 16 from version 10), the bytes, up to four 0 bits, zero bits to a
               byte, then the pad bytes 0xEC 0x11 in turn up to the version's data codewords
    blocks     the data cut into the version's blocks, each followed by its Reed-Solomon codewords (GF(256) over
               x^8 + x^4 + x^3 + x^2 + 1, the generator's roots 2^0 .. 2^(n-1)), interleaved codeword by codeword
    matrix     the three finders with their separators, the timing rows, the alignment patterns, the dark module,
               the version's bits (from version 7); the codewords placed in two-column zigzags from the bottom
               right; each of the eight masks tried and the one with the lowest penalty (runs, 2x2 blocks,
               finder-like patterns, dark balance) kept, its format bits written

`matrix(text)` is the symbol as rows of booleans (True: dark); `svg(text)` draws it with its four-module quiet
zone; `data_uri(text)` is that drawing as an image address for the page's Markdown; `fits(text)` says whether a
text is short enough.
"""

from __future__ import annotations

import base64

# Level M, versions 1 to 10: (error-correction codewords per block, [(blocks, data codewords per block), ...]).
BLOCKS = {1: (10, [(1, 16)]), 2: (16, [(1, 28)]), 3: (26, [(1, 44)]), 4: (18, [(2, 32)]), 5: (24, [(2, 43)]),
          6: (16, [(4, 27)]), 7: (18, [(4, 31)]), 8: (22, [(2, 38), (2, 39)]), 9: (22, [(3, 36), (2, 37)]),
          10: (26, [(4, 43), (1, 44)])}
ALIGNMENT = {1: [], 2: [6, 18], 3: [6, 22], 4: [6, 26], 5: [6, 30], 6: [6, 34], 7: [6, 22, 38], 8: [6, 24, 42],
             9: [6, 26, 46], 10: [6, 28, 50]}
LEVEL_M = 0b00  # the format bits' error-correction level
QUIET = 4       # modules of light margin a reader needs around the symbol
MASKS = (lambda x, y: (x + y) % 2 == 0, lambda x, y: y % 2 == 0, lambda x, y: x % 3 == 0,
         lambda x, y: (x + y) % 3 == 0, lambda x, y: (x // 3 + y // 2) % 2 == 0,
         lambda x, y: x * y % 2 + x * y % 3 == 0, lambda x, y: (x * y % 2 + x * y % 3) % 2 == 0,
         lambda x, y: ((x + y) % 2 + x * y % 3) % 2 == 0)


def data_codewords(version: int) -> int:
    _, groups = BLOCKS[version]
    return sum(n * size for n, size in groups)


def capacity(version: int) -> int:
    """The most bytes a symbol of `version` holds at level M."""
    return (data_codewords(version) * 8 - 4 - _count_bits(version)) // 8


def fits(text: str) -> bool:
    """Whether `text` fits the largest symbol made here."""
    return len(text.encode("utf-8")) <= capacity(max(BLOCKS))


def _count_bits(version: int) -> int:
    return 8 if version < 10 else 16


def matrix(text: str) -> list[list[bool]]:
    """The QR symbol of `text` (UTF-8) at level M, the smallest version that holds it, as rows of modules (True:
    dark), without its quiet zone. Raises ValueError past version 10's 213 bytes."""
    raw = text.encode("utf-8")
    version = next((v for v in BLOCKS if len(raw) <= capacity(v)), None)
    if version is None:
        raise ValueError(f"{len(raw)} bytes do not fit a version-10 QR code at level M ({capacity(10)} at most)")
    symbol = _Symbol(version)
    symbol.place(_interleaved(_data(raw, version), version))
    return symbol.masked_best()


def svg(text: str, module_px: int = 8) -> str:
    """The symbol of `text` drawn as an SVG image, dark modules on white, with its quiet zone."""
    rows = matrix(text)
    side = len(rows) + 2 * QUIET
    path = "".join(f"M{x + QUIET},{y + QUIET}h1v1h-1z" for y, row in enumerate(rows) for x, dark in enumerate(row)
                   if dark)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {side} {side}" width="{side * module_px}" '
            f'height="{side * module_px}" shape-rendering="crispEdges"><rect width="{side}" height="{side}" '
            f'fill="#fff"/><path d="{path}" fill="#000"/></svg>')


def data_uri(text: str, module_px: int = 8) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg(text, module_px).encode("ascii")).decode("ascii")


# ------------------------------------------------------------------------------------------ codewords


def _data(raw: bytes, version: int) -> list[int]:
    """The data codewords: mode, count, bytes, terminator, padding."""
    bits = [0, 1, 0, 0] + _bits(len(raw), _count_bits(version))
    for byte in raw:
        bits += _bits(byte, 8)
    room = data_codewords(version) * 8
    bits += [0] * min(4, room - len(bits))
    bits += [0] * (-len(bits) % 8)
    words = [int("".join(map(str, bits[i:i + 8])), 2) for i in range(0, len(bits), 8)]
    pad = (0xEC, 0x11)
    return words + [pad[i % 2] for i in range(data_codewords(version) - len(words))]


def _bits(value: int, n: int) -> list[int]:
    return [(value >> i) & 1 for i in reversed(range(n))]


def _interleaved(data: list[int], version: int) -> list[int]:
    ec, groups = BLOCKS[version]
    blocks, at = [], 0
    for n, size in groups:
        for _ in range(n):
            blocks.append(data[at:at + size])
            at += size
    divisor = _divisor(ec)
    checks = [_remainder(block, divisor) for block in blocks]
    out = [b[i] for i in range(max(map(len, blocks))) for b in blocks if i < len(b)]
    return out + [c[i] for i in range(ec) for c in checks]


def _mul(a: int, b: int) -> int:
    """a * b in GF(256) modulo x^8 + x^4 + x^3 + x^2 + 1."""
    out = 0
    for i in reversed(range(8)):
        out = (out << 1) ^ (0x11D if out & 0x80 else 0)
        out ^= a if (b >> i) & 1 else 0
    return out


def _divisor(degree: int) -> list[int]:
    """The Reed-Solomon generator (x - 2^0)(x - 2^1)...(x - 2^(degree-1)), its coefficients from the highest
    power down, the leading 1 left out."""
    out, root = [0] * (degree - 1) + [1], 1
    for _ in range(degree):
        for j in range(degree):
            out[j] = _mul(out[j], root) ^ (out[j + 1] if j + 1 < degree else 0)
        root = _mul(root, 2)
    return out


def _remainder(data: list[int], divisor: list[int]) -> list[int]:
    out = [0] * len(divisor)
    for byte in data:
        factor = byte ^ out.pop(0)
        out.append(0)
        out = [r ^ _mul(c, factor) for r, c in zip(out, divisor)]
    return out


# ------------------------------------------------------------------------------------------ the matrix


class _Symbol:
    """The modules of one symbol and which of them are function patterns (never masked, never data)."""

    def __init__(self, version: int):
        self.version, self.size = version, 17 + 4 * version
        n = self.size
        self.dark = [[False] * n for _ in range(n)]
        self.fixed = [[False] * n for _ in range(n)]
        for i in range(n):
            self._set(6, i, i % 2 == 0)
            self._set(i, 6, i % 2 == 0)
        for cx, cy in ((3, 3), (n - 4, 3), (3, n - 4)):
            for dy in range(-4, 5):
                for dx in range(-4, 5):
                    if 0 <= cx + dx < n and 0 <= cy + dy < n:
                        self._set(cx + dx, cy + dy, max(abs(dx), abs(dy)) not in (2, 4))
        centres = ALIGNMENT[version]
        for i, cx in enumerate(centres):
            for j, cy in enumerate(centres):
                if (i, j) in ((0, 0), (0, len(centres) - 1), (len(centres) - 1, 0)):
                    continue  # the finders' corners
                for dy in range(-2, 3):
                    for dx in range(-2, 3):
                        self._set(cx + dx, cy + dy, max(abs(dx), abs(dy)) != 1)
        self._format(0)  # reserved now, rewritten with the mask chosen
        if version >= 7:
            bits = version << 12 | _bch(version, 0x1F25, 12)
            for i in range(18):
                a, b, on = n - 11 + i % 3, i // 3, (bits >> i) & 1 == 1
                self._set(a, b, on)
                self._set(b, a, on)

    def _set(self, x: int, y: int, on: bool) -> None:
        self.dark[y][x], self.fixed[y][x] = on, True

    def _format(self, mask: int) -> None:
        data = LEVEL_M << 3 | mask
        bits = (data << 10 | _bch(data, 0x537, 10)) ^ 0x5412
        bit = [(bits >> i) & 1 == 1 for i in range(15)]
        n = self.size
        for i in range(6):
            self._set(8, i, bit[i])
        self._set(8, 7, bit[6])
        self._set(8, 8, bit[7])
        self._set(7, 8, bit[8])
        for i in range(9, 15):
            self._set(14 - i, 8, bit[i])
        for i in range(8):
            self._set(n - 1 - i, 8, bit[i])
        for i in range(8, 15):
            self._set(8, n - 15 + i, bit[i])
        self._set(8, n - 8, True)  # the dark module

    def place(self, codewords: list[int]) -> None:
        """The codewords' bits, most significant first, up and down two-column strips from the bottom right (the
        timing column skipped); modules left over (the remainder bits) stay light."""
        n, i, total = self.size, 0, len(codewords) * 8
        right = n - 1
        while right >= 1:
            if right == 6:
                right = 5
            upward = (right + 1) & 2 == 0
            for vert in range(n):
                y = n - 1 - vert if upward else vert
                for x in (right, right - 1):
                    if not self.fixed[y][x] and i < total:
                        self.dark[y][x] = (codewords[i >> 3] >> (7 - (i & 7))) & 1 == 1
                        i += 1
            right -= 2

    def masked_best(self) -> list[list[bool]]:
        """The symbol under each mask with its format bits; the one of lowest penalty (the first of equal ones)."""
        best = None
        for m, rule in enumerate(MASKS):
            self._format(m)
            rows = [[d != (not f and rule(x, y)) for x, (d, f) in enumerate(zip(dr, fr))]
                    for y, (dr, fr) in enumerate(zip(self.dark, self.fixed))]
            score = penalty(rows)
            if best is None or score < best[0]:
                best = (score, m, rows)
        self._format(best[1])
        return best[2]


def _bch(data: int, generator: int, n: int) -> int:
    """The remainder of data * x^n divided by the generator polynomial over GF(2) (n check bits)."""
    rem = data << n
    top = generator.bit_length() - 1
    for shift in reversed(range(rem.bit_length() - top)):
        if (rem >> (shift + top)) & 1:
            rem ^= generator << shift
    return rem


FINDER_LIKE = ([True, False, True, True, True, False, True, False, False, False, False],
               [False, False, False, False, True, False, True, True, True, False, True])


def penalty(rows: list[list[bool]]) -> int:
    """The standard's mask penalty: runs of five or more of a colour (3, plus 1 a module past five), 2x2 blocks of
    a colour (3 each), finder-like 1:1:3:1:1 patterns beside four light modules (40 each), and 10 for each 5% the
    dark share is away from half."""
    n = len(rows)
    lines = rows + [list(col) for col in zip(*rows)]
    score = 0
    for line in lines:
        run = 1
        for a, b in zip(line, line[1:] + [None]):
            if a == b:
                run += 1
                continue
            score += 3 + run - 5 if run >= 5 else 0
            run = 1
        for i in range(n - 10):
            score += 40 * (line[i:i + 11] in FINDER_LIKE)
    for y in range(n - 1):
        for x in range(n - 1):
            score += 3 * (rows[y][x] == rows[y][x + 1] == rows[y + 1][x] == rows[y + 1][x + 1])
    dark = sum(map(sum, rows))
    return score + 10 * (abs(dark * 100 // (n * n) - 50) // 5)
