"""One cycle to take away: its four views as one picture, and "Explain these four views" as a printable page.

Both are made in the browser from what the page shows at the moment (the cycle, and the phase Play phases stopped
at): Plotly draws each view again as a PNG at twice its size on screen (`Plotly.toImage`, from the figure's data, so
the dark theme's inversion and the projector's zoom do not reach it), and the explanations are the page's own words
with this cycle's numbers. A follower's page makes them as the instructor's does; the server does no work.

    PICTURE_JS  the four views in a 2 x 2 grid under the cycle's caption and the run's summary, downloaded as
                eagleviz-cycle-N.png
    HANDOUT_JS  one printed page (A4 or Letter): the caption, then each view beside its explanation; opened in a
                new tab with the browser's print dialog, or downloaded as an HTML file where new tabs are refused
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
