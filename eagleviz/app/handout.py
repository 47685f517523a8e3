"""One cycle to take away: its four views as one picture, and "Explain these four views" as a printable page.

Both are made in the browser from what the page shows at the moment (the cycle, and the phase Play phases stopped
at): Plotly draws each view again as a PNG at twice its size on screen (`Plotly.toImage`, from the figure's data, so
the dark theme's inversion and the projector's zoom do not reach it), and the explanations are the page's own words
with this cycle's numbers. A follower's page makes them as the instructor's does; the server does no work.

    PICTURE_JS  the four views in a 2 x 2 grid under the cycle's caption and the run's summary, downloaded as
                eagleviz-cycle-N.png
    HANDOUT_JS  one printed page (A4 or Letter): the caption, then each view beside its explanation; opened in a
                new tab with the browser's print dialog, or downloaded as an HTML file where new tabs are refused
    GIF_JS      Play phases of the cycle as a looping GIF, eagleviz-cycle-N-phases.gif: the one export that asks the
                server, for the figures of every phase (`navigation.phase_frames`), which the page draws and encodes
Each returns one line for the page (what it made, or why it could not).
"""

from __future__ import annotations

import json

from eagleviz.visuals.explain import TOUR

# The four views in the tour's order, with the tour's names for them.
VIEWS = (("draft-tree", "Draft: the tree the head grew"), ("attention-mask", "Verify: the tree attention mask"),
         ("accepted-path", "Accept: the path the target kept"), ("kv-rewind", "Rewind: the KV cache"))
SCALE = 2              # pixels of the picture per pixel of the figure on screen
HANDOUT_TITLE = "EAGLE speculative decoding: one cycle, four views"
FOOTER = "Drawn by eagleviz from a real run: every number is what the engine did."
# The handout's heading of each view: the tour's stop, then what the view shows.
HEADINGS = [f"{stop} \u00b7 {name.split(': ')[1]}" for stop, (_, name) in zip(TOUR, VIEWS)]
NO_PICTURE = "\u26a0 No picture to save yet: run a prompt (or open a recorded run) first."

# The handout is sized for a page 190 mm wide (A4 less its margins) and 259 mm high (Letter less its margins):
# each view's picture at most 62 mm high, its explanation in 8.5 pt beside nothing but the other view of its row.
HANDOUT_CSS = """
@page { margin: 10mm; }
body { font: 9pt/1.35 system-ui, -apple-system, 'Segoe UI', sans-serif; color: #1f2328; margin: 0 auto;
       max-width: 190mm; }
h1 { font-size: 13pt; margin: 0 0 1.5mm; }
.caption, .summary { margin: 0 0 1.2mm; }
.summary { color: #57606a; font-size: 8pt; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 3mm 5mm; margin-top: 2mm; }
.view { break-inside: avoid; }
.view h2 { font-size: 10pt; margin: 0 0 1mm; }
.view img { display: block; width: 100%; max-height: 62mm; object-fit: contain; }
.view .words { font-size: 8.5pt; margin-top: 1mm; }
code { font-size: 0.92em; background: #eff1f3; border-radius: 3px; padding: 0 2px; }
p { margin: 0 0 1mm; }
footer { margin-top: 3mm; font-size: 7.5pt; color: #57606a; }
@media screen { body { padding: 12px; } }
"""

# The four figures as PNG data URLs and their sizes in px ({missing: true} when a view has no figure yet), the
# selected cycle, and the caption and summary as text and HTML: what both exports read from the page.
_READ = f"""async () => {{
  const ids = {json.dumps([v for v, _ in VIEWS])};
  const gds = ids.map((id) => document.querySelector('#' + id + ' .js-plotly-plot'));
  if (!window.Plotly || gds.some((g) => !g || !g._fullLayout || !(g.data || []).length)) return {{missing: true}};
  const sizes = gds.map((g) => [Math.round(g._fullLayout.width), Math.round(g._fullLayout.height)]);
  const urls = await Promise.all(gds.map((g, i) =>
    Plotly.toImage(g, {{format: 'png', width: sizes[i][0], height: sizes[i][1], scale: {SCALE}}})));
  const el = (id) => document.getElementById(id);
  const cycle = el('cycle-slider')?.querySelector('input[type=range]')?.value ?? '0';
  const text = (id) => (el(id)?.innerText || '').trim();
  const unlinked = (e) => {{   // the glossary's links lead nowhere on paper: their words stay
    const c = (e?.querySelector('.prose') || e)?.cloneNode(true);
    c?.querySelectorAll('a').forEach((a) => a.replaceWith(a.textContent));
    return c?.innerHTML || '';
  }};
  const words = [...document.querySelectorAll('#explain .ev-explain')]   // Gradio marks a box and its inner box
    .filter((e) => !e.parentElement.closest('.ev-explain')).map(unlinked);
  return {{urls, sizes, cycle, caption: text('cycle-caption'), summary: text('summary'),
           captionHtml: unlinked(el('cycle-caption')), words}};
}}"""

PICTURE_JS = f"""async () => {{
  const got = await ({_READ})();
  if (got.missing) return {json.dumps(NO_PICTURE)};
  const imgs = await Promise.all(got.urls.map((u) => new Promise((ok, no) => {{
    const i = new Image(); i.onload = () => ok(i); i.onerror = no; i.src = u; }})));
  const s = {SCALE}, pad = 12 * s, cellW = Math.max(...imgs.map((i) => i.width)),
        rowH = [Math.max(imgs[0].height, imgs[1].height), Math.max(imgs[2].height, imgs[3].height)];
  const canvas = document.createElement('canvas'), ctx = canvas.getContext('2d');
  const font = (px, bold) => (bold ? 'bold ' : '') + px * s + 'px system-ui, sans-serif';
  const width = 2 * cellW + 3 * pad;
  const lines = (t, px, bold) => {{   // the text wrapped to the picture's width
    ctx.font = font(px, bold); const out = []; let line = '';
    for (const w of t.split(/\\s+/)) {{
      const next = line ? line + ' ' + w : w;
      if (ctx.measureText(next).width > width - 2 * pad && line) {{ out.push(line); line = w; }} else line = next;
    }}
    if (line) out.push(line);
    return out;
  }};
  const head = [[lines(got.caption, 16, true), 16, true, '#1f2328'], [lines(got.summary, 12, false), 12, false,
                '#57606a']];
  const headH = head.reduce((h, [ls, px]) => h + ls.length * px * 1.4 * s, 0) + pad;
  canvas.width = width; canvas.height = headH + rowH[0] + rowH[1] + 3 * pad;
  ctx.fillStyle = '#ffffff'; ctx.fillRect(0, 0, canvas.width, canvas.height);
  let y = pad;
  for (const [ls, px, bold, colour] of head) {{
    ctx.font = font(px, bold); ctx.fillStyle = colour; ctx.textBaseline = 'top';
    for (const l of ls) {{ ctx.fillText(l, pad, y); y += px * 1.4 * s; }}
  }}
  imgs.forEach((img, i) => ctx.drawImage(img, pad + (i % 2) * (cellW + pad),
                                          headH + pad + (i < 2 ? 0 : rowH[0] + pad)));
  const name = 'eagleviz-cycle-' + got.cycle + '.png';
  const blob = await new Promise((ok) => canvas.toBlob(ok, 'image/png'));
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob); a.download = name; document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  return 'Saved ' + name + ': the four views of cycle ' + got.cycle + ', ' + canvas.width + ' x ' + canvas.height
    + ' px.';
}}"""

# The tab is opened before the pictures are drawn: a browser lets a click open one only while the click is recent.
HANDOUT_JS = f"""async () => {{
  const tab = window.open('', '_blank');
  const got = await ({_READ})();
  if (got.missing) {{ tab?.close(); return {json.dumps(NO_PICTURE)}; }}
  const names = {json.dumps(HEADINGS)};
  const esc = (t) => t.replace(/&/g, '&amp;').replace(/</g, '&lt;');
  const cells = got.urls.map((u, i) => '<section class="view"><h2>' + esc(names[i]) + '</h2><img src="' + u +
    '" alt="' + esc(names[i]) + '"><div class="words">' + (got.words[i] || '') + '</div></section>').join('');
  const page = '<!doctype html><html><head><meta charset="utf-8"><title>' + esc({json.dumps(HANDOUT_TITLE)}) +
    ' (cycle ' + got.cycle + ')</title><style>' + {json.dumps(HANDOUT_CSS)} + '</style></head><body><h1>' +
    esc({json.dumps(HANDOUT_TITLE)}) + '</h1><div class="caption">' + got.captionHtml + '</div><div class="summary">'
    + esc(got.summary) + '</div><div class="grid">' + cells + '</div><footer>' + esc({json.dumps(FOOTER)}) +
    '</footer></body></html>';
  const name = 'eagleviz-handout-cycle-' + got.cycle + '.html';
  if (!tab) {{   // new tabs refused: the same page as a file
    const a = document.createElement('a');
    a.href = URL.createObjectURL(new Blob([page], {{type: 'text/html'}})); a.download = name;
    document.body.appendChild(a); a.click(); a.remove();
    return 'This browser refused a new tab: the handout was saved as ' + name + '; open it and print it.';
  }}
  tab.document.open(); tab.document.write(page); tab.document.close();
  const images = [...tab.document.images].map((i) => i.complete ? null : new Promise((ok) => {{ i.onload = ok;
    i.onerror = ok; }}));
  await Promise.all(images);
  tab.focus(); tab.print();
  return 'The handout of cycle ' + got.cycle + ' opened in a new tab with the print dialog (one page, A4 or Letter).';
}}"""

# Play phases as an animated GIF: the server sends the cycle's figures frame by frame (`navigation.phase_frames`);
# Plotly draws each view at its size on screen and the frames are laid out as the picture's grid under a line naming
# the phase. The palette is the frames' 256 commonest colours (5 bits a channel, each the average of the colours it
# stands for: a figure's flat fills exactly, its anti-aliased edges nearly), then GIF89a's LZW, looping.
FRAME_CS, LAST_FRAME_CS = 110, 300   # each frame's time in hundredths of a second; the end state's is longer
NO_FRAMES = "\u26a0 No cycle to animate yet: run a prompt (or open a recorded run) first."

GIF_JS = f"""async (data) => {{
  if (!data || !window.Plotly) return {json.dumps(NO_FRAMES)};
  const got = JSON.parse(data), n = got.frames.length;
  const ids = {json.dumps([v for v, _ in VIEWS])};
  const sizes = ids.map((id) => {{
    const l = document.querySelector('#' + id + ' .js-plotly-plot')?._fullLayout;
    return l ? [Math.round(l.width), Math.round(l.height)] : [640, 480]; }});
  const load = (u) => new Promise((ok, no) => {{ const i = new Image(); i.onload = () => ok(i); i.onerror = no;
    i.src = u; }});
  const pad = 12, headH = 34, cellW = Math.max(...sizes.map((s) => s[0])),
        rowH = [Math.max(sizes[0][1], sizes[1][1]), Math.max(sizes[2][1], sizes[3][1])];
  const W = 2 * cellW + 3 * pad, H = headH + rowH[0] + rowH[1] + 2 * pad;
  const canvas = document.createElement('canvas'), ctx = canvas.getContext('2d', {{willReadFrequently: true}});
  canvas.width = W; canvas.height = H;
  const pixels = [];
  for (const [k, frame] of got.frames.entries()) {{
    const urls = await Promise.all(frame.figures.map((f, i) => Plotly.toImage({{data: f.data, layout: f.layout}},
      {{format: 'png', width: sizes[i][0], height: sizes[i][1], scale: 1}})));
    const imgs = await Promise.all(urls.map(load));
    ctx.fillStyle = '#ffffff'; ctx.fillRect(0, 0, W, H);
    ctx.fillStyle = '#1f2328'; ctx.font = 'bold 16px system-ui, sans-serif'; ctx.textBaseline = 'top';
    ctx.fillText('Cycle ' + got.cycle + ' \\u00b7 phase ' + (k + 1) + ' of ' + n + ': ' + frame.label, pad, pad);
    imgs.forEach((img, i) => ctx.drawImage(img, pad + (i % 2) * (cellW + pad), headH + (i < 2 ? 0 : rowH[0] + pad)));
    pixels.push(ctx.getImageData(0, 0, W, H).data);
  }}
  const key = (px, p) => ((px[p] >> 3) << 10) | ((px[p + 1] >> 3) << 5) | (px[p + 2] >> 3);
  const count = new Float64Array(32768), sum = new Float64Array(3 * 32768);
  for (const px of pixels) for (let p = 0; p < px.length; p += 4) {{
    const c = key(px, p); count[c]++; sum[3 * c] += px[p]; sum[3 * c + 1] += px[p + 1]; sum[3 * c + 2] += px[p + 2]; }}
  const used = [];
  for (let c = 0; c < 32768; c++) if (count[c]) used.push(c);
  used.sort((a, b) => count[b] - count[a]);
  const mean = (c) => [0, 1, 2].map((j) => Math.round(sum[3 * c + j] / count[c]));
  const palette = used.slice(0, 256).map(mean);
  while (palette.length < 256) palette.push([0, 0, 0]);
  const near = new Int16Array(32768).fill(-1);
  const nearest = (c) => {{   // the palette's closest colour to what bin c stands for, found once a bin
    const [r, g, b] = mean(c); let best = 0, dist = Infinity;
    palette.forEach(([pr, pg, pb], j) => {{ const d = (r - pr) ** 2 + (g - pg) ** 2 + (b - pb) ** 2;
      if (d < dist) {{ dist = d; best = j; }} }});
    return near[c] = best;
  }};
  const chunks = [], bytes = (...b) => chunks.push(Uint8Array.from(b));
  const text = (s) => bytes(...[...s].map((ch) => ch.charCodeAt(0)));
  const u16 = (v) => bytes(v & 255, v >> 8);
  const lzw = (index) => {{   // GIF's LZW with 8-bit pixels: codes of 9 to 12 bits, a clear code when 4096 are used
    const out = []; let acc = 0, bits = 0, size = 9, next = 258, table = new Map();
    const put = (code) => {{ acc |= code << bits; bits += size; while (bits >= 8) {{ out.push(acc & 255); acc >>>= 8;
      bits -= 8; }} }};
    put(256);
    let prefix = index[0];
    for (let i = 1; i < index.length; i++) {{
      const c = index[i], k = prefix * 256 + c, hit = table.get(k);
      if (hit !== undefined) {{ prefix = hit; continue; }}
      put(prefix);
      if (next === 4096) {{ put(256); table = new Map(); next = 258; size = 9; }}
      else {{ if (next >= 1 << size) size++; table.set(k, next++); }}
      prefix = c;
    }}
    put(prefix); put(257);
    if (bits > 0) out.push(acc & 255);
    return out;
  }};
  text('GIF89a'); u16(W); u16(H); bytes(0xf7, 0, 0); bytes(...palette.flat());
  bytes(0x21, 0xff, 11); text('NETSCAPE2.0'); bytes(3, 1, 0, 0, 0);   // loop for ever
  pixels.forEach((px, k) => {{
    const index = new Uint8Array(W * H);
    for (let p = 0, i = 0; p < px.length; p += 4, i++) {{ const c = key(px, p); const j = near[c];
      index[i] = j >= 0 ? j : nearest(c); }}
    const delay = k === n - 1 ? {LAST_FRAME_CS} : {FRAME_CS};
    bytes(0x21, 0xf9, 4, 0x04, delay & 255, delay >> 8, 0, 0);
    bytes(0x2c); u16(0); u16(0); u16(W); u16(H); bytes(0, 8);
    const data = lzw(index);
    for (let i = 0; i < data.length; i += 255) {{ const part = data.slice(i, i + 255);
      chunks.push(Uint8Array.from([part.length, ...part])); }}
    bytes(0);
  }});
  bytes(0x3b);
  const name = 'eagleviz-cycle-' + got.cycle + '-phases.gif';
  const a = document.createElement('a');
  a.href = URL.createObjectURL(new Blob(chunks, {{type: 'image/gif'}})); a.download = name;
  document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  return 'Saved ' + name + ': the ' + n + ' phases of cycle ' + got.cycle + ' as Play phases shows them, ' + W +
    ' x ' + H + ' px.';
}}"""
