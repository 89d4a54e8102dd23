(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const api = (window.ragMap = { ready: false, count: 0, renderer: null });
  let data;
  try {
    data = JSON.parse($("map-data").textContent);
  } catch (err) {
    const box = document.createElement("div");
    box.id = "error";
    box.className = "box";
    box.textContent = "The map data could not be read.";
    document.body.appendChild(box);
    return;
  }

  // ------------------------------------------------------------------ data
  const P = data.papers || {};
  const ids = P.ids || [], titles = P.titles || [], authors = P.authors || [], years = P.years || [];
  const venues = P.venues || [], urls = P.urls || [], abstracts = Array.isArray(P.abstracts) ? P.abstracts : null;
  const clusters = Array.isArray(data.clusters) ? data.clusters : [];
  const n = ids.length;
  api.count = n;
  const X = new Float32Array(n), Y = new Float32Array(n), C = new Int32Array(n);
  let minX = Infinity, minY = Infinity, maxX = -Infinity, maxY = -Infinity;
  for (let i = 0; i < n; i++) {
    X[i] = +P.x[i] || 0; Y[i] = +P.y[i] || 0;
    const x = X[i], y = Y[i], c = P.cluster ? P.cluster[i] : -1;  // bounds of the float32 values, as drawn
    C[i] = Number.isInteger(c) && c >= 0 && c < clusters.length ? c : -1;
    if (x < minX) minX = x; if (x > maxX) maxX = x;
    if (y < minY) minY = y; if (y > maxY) maxY = y;
  }
  if (!n) { minX = minY = -1; maxX = maxY = 1; }
  const byId = new Map();
  for (let i = 0; i < n; i++) if (!byId.has(ids[i])) byId.set(ids[i], i);
  const fmt = (k) => k.toLocaleString("en-US");

  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#393b79", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
    "#9edae5", "#637939", "#843c39"];
  const rgb = (h) => [parseInt(h.slice(1, 3), 16), parseInt(h.slice(3, 5), 16), parseInt(h.slice(5, 7), 16)];
  const PAL = PALETTE.map(rgb);
  const BG = rgb("#f7f7f9"), INK = [21, 21, 28];
  const NO_CLUSTER = [168, 168, 176, 200];
  const CITED = [255, 208, 0, 255], RETRIEVED = [255, 255, 255, 255], SELECTED = [36, 86, 199, 255];
  const clusterColor = (c) => (c < 0 ? NO_CLUSTER : PAL[c % PAL.length].concat(235));
  const cssColor = (c) => "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")";

  // ------------------------------------------------------------------ view
  let canvas = $("map");
  const view = { cx: 0, cy: 0, s: 1 };
  let W = 1, H = 1, dpr = 1, fitS = 1, userMoved = false;
  const BASE_SIZE = n > 50000 ? 2.5 : n > 10000 ? 3.5 : n > 1000 ? 5 : 7;
  const zoomBoost = () => Math.min(3, Math.max(1, Math.sqrt(view.s / fitS)));
  const toScreenX = (x) => W / 2 + (x - view.cx) * view.s;
  const toScreenY = (y) => H / 2 - (y - view.cy) * view.s;

  function computeFit() {
    const pad = Math.min(60, Math.min(W, H) * 0.08);
    const spanX = Math.max(maxX - minX, 0.2), spanY = Math.max(maxY - minY, 0.2);
    fitS = Math.max(1e-6, Math.min((W - 2 * pad) / spanX, (H - 2 * pad) / spanY));
  }
  function resetView() {
    computeFit();
    view.cx = (minX + maxX) / 2; view.cy = (minY + maxY) / 2; view.s = fitS;
    userMoved = false;
    hideTip();
    render();
  }
  const clampScale = (s) => Math.min(fitS * 5000, Math.max(fitS / 4, s));
  function zoomAt(sx, sy, k) {
    const dx = view.cx + (sx - W / 2) / view.s, dy = view.cy - (sy - H / 2) / view.s;
    view.s = clampScale(view.s * k);
    view.cx = dx - (sx - W / 2) / view.s;
    view.cy = dy + (sy - H / 2) / view.s;
    userMoved = true;
    render();
  }
  function panBy(px, py) {
    view.cx -= px / view.s; view.cy += py / view.s;
    userMoved = true;
    render();
  }

  // ------------------------------------------------------------------ layers (one draw call each)
  // size() in CSS px; shape: 0 disc, 1 disc with a dark ring, 2 diamond with a dark ring, 3 ring alone.
  function layer(size, shape, ring, fade) {
    return { pos: new Float32Array(0), col: new Uint8Array(0), count: 0, size, shape, ring, fade,
      dirty: true, bufPos: null, bufCol: null };
  }
  function fill(L, list, fixed, at) {
    const m = list.length, pos = new Float32Array(2 * m), col = new Uint8Array(4 * m);
    for (let k = 0; k < m; k++) {
      const i = list[k], c = fixed || clusterColor(C[i]), xy = at ? at(i) : null;
      pos[2 * k] = xy ? xy[0] : X[i]; pos[2 * k + 1] = xy ? xy[1] : Y[i];
      col[4 * k] = c[0]; col[4 * k + 1] = c[1]; col[4 * k + 2] = c[2]; col[4 * k + 3] = c[3];
    }
    L.pos = pos; L.col = col; L.count = m; L.dirty = true;
  }
  let matches = null, cited = [], retrieved = [], selected = -1;
  const baseFade = () => (matches ? 0.13 : cited.length || retrieved.length ? 0.7 : 1);
  const base = layer(() => BASE_SIZE * zoomBoost(), 0, 0, baseFade);
  const matchLayer = layer(() => Math.max(5, BASE_SIZE * zoomBoost() + 2), 0, 0, () => 1);
  const retrievedLayer = layer(() => 13, 2, 1.5, () => 1);
  const citedLayer = layer(() => 17, 1, 2.5, () => 1);
  const selectedLayer = layer(() => 24, 3, 2.5, () => 1);
  const layers = [base, matchLayer, retrievedLayer, citedLayer, selectedLayer];
  {
    // Counting sort by cluster: the 2D fallback then changes fill colour once per cluster, not per point,
    // and the unclustered (grey) points lie underneath.
    const counts = new Int32Array(clusters.length + 2);
    for (let i = 0; i < n; i++) counts[C[i] + 2]++;
    for (let k = 1; k < counts.length; k++) counts[k] += counts[k - 1];
    const order = new Int32Array(n);
    for (let i = 0; i < n; i++) order[counts[C[i] + 1]++] = i;
    fill(base, order, null);
  }

  // ------------------------------------------------------------------ renderers
  let gl = null, ctx = null, prog = null, loc = null, maxPoint = 64;
  const VS = "attribute vec2 a_pos; attribute vec4 a_color; uniform vec2 u_scale; uniform vec2 u_offset;" +
    "uniform float u_size; varying vec4 v_color;" +
    "void main() { gl_Position = vec4(a_pos * u_scale + u_offset, 0.0, 1.0); gl_PointSize = u_size;" +
    " v_color = a_color; }";
  const FS = "precision mediump float; varying vec4 v_color; uniform float u_shape; uniform float u_diam;" +
    "uniform float u_ring; uniform float u_fade; uniform vec3 u_bg; uniform vec3 u_ink;" +
    "void main() {" +
    " vec2 p = gl_PointCoord * 2.0 - 1.0;" +
    " float r = (u_shape > 1.5 && u_shape < 2.5) ? abs(p.x) + abs(p.y) : length(p);" +
    " float px = 2.0 / u_diam;" +
    " float inside = 1.0 - smoothstep(1.0 - px, 1.0, r);" +
    " if (inside <= 0.0) discard;" +
    " vec3 c = mix(u_bg, v_color.rgb, u_fade); float a = v_color.a;" +
    " float edge = 1.0 - u_ring;" +
    " if (u_shape > 2.5) { a *= smoothstep(edge - px, edge, r); }" +
    " else if (u_shape > 0.5) { float t = smoothstep(edge - px, edge, r); c = mix(c, u_ink, t);" +
    "  a = mix(a, 1.0, t); }" +
    " a *= inside; if (a <= 0.0) discard;" +
    " gl_FragColor = vec4(c * a, a); }";

  function setupGL() {
    const compile = (type, src) => {
      const sh = gl.createShader(type);
      gl.shaderSource(sh, src); gl.compileShader(sh);
      return gl.getShaderParameter(sh, gl.COMPILE_STATUS) ? sh : null;
    };
    const vs = compile(gl.VERTEX_SHADER, VS), fs = compile(gl.FRAGMENT_SHADER, FS);
    if (!vs || !fs) return false;
    prog = gl.createProgram();
    gl.attachShader(prog, vs); gl.attachShader(prog, fs); gl.linkProgram(prog);
    if (!gl.getProgramParameter(prog, gl.LINK_STATUS)) return false;
    loc = {};
    for (const a of ["a_pos", "a_color"]) loc[a] = gl.getAttribLocation(prog, a);
    for (const u of ["u_scale", "u_offset", "u_size", "u_diam", "u_shape", "u_ring", "u_fade", "u_bg", "u_ink"])
      loc[u] = gl.getUniformLocation(prog, u);
    const range = gl.getParameter(gl.ALIASED_POINT_SIZE_RANGE);
    maxPoint = range ? range[1] : 64;
    gl.enable(gl.BLEND);
    gl.blendFunc(gl.ONE, gl.ONE_MINUS_SRC_ALPHA);  // the fragment shader outputs premultiplied colour
    for (const L of layers) { L.bufPos = L.bufCol = null; L.dirty = true; }
    return true;
  }
  function drawGL() {
    gl.viewport(0, 0, canvas.width, canvas.height);
    gl.clearColor(BG[0] / 255, BG[1] / 255, BG[2] / 255, 1);
    gl.clear(gl.COLOR_BUFFER_BIT);
    gl.useProgram(prog);
    const kx = (2 * view.s) / W, ky = (2 * view.s) / H;
    gl.uniform2f(loc.u_scale, kx, ky);
    gl.uniform2f(loc.u_offset, -view.cx * kx, -view.cy * ky);
    gl.uniform3f(loc.u_bg, BG[0] / 255, BG[1] / 255, BG[2] / 255);
    gl.uniform3f(loc.u_ink, INK[0] / 255, INK[1] / 255, INK[2] / 255);
    gl.enableVertexAttribArray(loc.a_pos);
    gl.enableVertexAttribArray(loc.a_color);
    for (const L of layers) {
      if (!L.count) continue;
      if (L.dirty || !L.bufPos) {
        L.bufPos = L.bufPos || gl.createBuffer();
        L.bufCol = L.bufCol || gl.createBuffer();
        gl.bindBuffer(gl.ARRAY_BUFFER, L.bufPos);
        gl.bufferData(gl.ARRAY_BUFFER, L.pos, gl.STATIC_DRAW);
        gl.bindBuffer(gl.ARRAY_BUFFER, L.bufCol);
        gl.bufferData(gl.ARRAY_BUFFER, L.col, gl.STATIC_DRAW);
        L.dirty = false;
      }
      gl.bindBuffer(gl.ARRAY_BUFFER, L.bufPos);
      gl.vertexAttribPointer(loc.a_pos, 2, gl.FLOAT, false, 0, 0);
      gl.bindBuffer(gl.ARRAY_BUFFER, L.bufCol);
      gl.vertexAttribPointer(loc.a_color, 4, gl.UNSIGNED_BYTE, true, 0, 0);
      const size = Math.min(L.size() * dpr, maxPoint);
      gl.uniform1f(loc.u_size, size);
      gl.uniform1f(loc.u_diam, size);  // the same value; a uniform shared by both shaders would need one precision
      gl.uniform1f(loc.u_shape, L.shape);
      gl.uniform1f(loc.u_ring, Math.min(1, (2 * L.ring * dpr) / size));
      gl.uniform1f(loc.u_fade, L.fade());
      gl.drawArrays(gl.POINTS, 0, L.count);
    }
  }
  function draw2D() {
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.globalAlpha = 1;
    ctx.fillStyle = cssColor(BG);
    ctx.fillRect(0, 0, W, H);
    for (const L of layers) {
      if (!L.count) continue;
      const size = L.size(), r = size / 2, fade = L.fade(), pos = L.pos, col = L.col, ringW = L.ring;
      const rr = L.shape ? r - ringW / 2 : r;  // strokes straddle the path: keep the outline inside the marker
      let last = -1, open = false;
      const flush = () => {
        if (!open) return;
        if (L.shape !== 3) ctx.fill();
        if (L.shape) { ctx.lineWidth = ringW; ctx.stroke(); }
        open = false;
      };
      for (let k = 0; k < L.count; k++) {
        const x = W / 2 + (pos[2 * k] - view.cx) * view.s, y = H / 2 - (pos[2 * k + 1] - view.cy) * view.s;
        if (x < -r || y < -r || x > W + r || y > H + r) continue;
        const key = ((col[4 * k] << 24) | (col[4 * k + 1] << 16) | (col[4 * k + 2] << 8) | col[4 * k + 3]) >>> 0;
        if (key !== last) {
          flush();
          const a = col[4 * k + 3] / 255, mix = (j) => Math.round(BG[j] + (col[4 * k + j] - BG[j]) * fade);
          const c = "rgba(" + mix(0) + "," + mix(1) + "," + mix(2) + "," + a + ")";
          ctx.fillStyle = c;
          ctx.strokeStyle = L.shape === 3 ? c : cssColor(INK);
          ctx.beginPath();
          open = true;
          last = key;
        }
        if (L.shape === 2) {
          ctx.moveTo(x, y - rr); ctx.lineTo(x + rr, y); ctx.lineTo(x, y + rr); ctx.lineTo(x - rr, y); ctx.closePath();
        } else if (size <= 3) {
          ctx.rect(x - r, y - r, size, size);
        } else {
          ctx.moveTo(x + rr, y); ctx.arc(x, y, rr, 0, 2 * Math.PI);
        }
      }
      flush();
    }
  }

  function startRenderer() {
    try {
      gl = canvas.getContext("webgl", { antialias: false, alpha: false, preserveDrawingBuffer: true });
    } catch (err) {
      gl = null;
    }
    if (gl && !setupGL()) {
      // A canvas that handed out a WebGL context never gives a 2D one: draw on a fresh canvas instead.
      const fresh = canvas.cloneNode(false);
      canvas.replaceWith(fresh);
      canvas = fresh;
      gl = null;
    }
    if (!gl) ctx = canvas.getContext("2d");
    api.renderer = gl ? "webgl" : "2d";
    document.body.dataset.renderer = api.renderer;
    canvas.addEventListener("webglcontextlost", (e) => e.preventDefault());
    canvas.addEventListener("webglcontextrestored", () => { if (setupGL()) render(); });
  }

  // ------------------------------------------------------------------ the answer's markers, spread apart
  // Papers of an answer often sit side by side on the map, and their markers (17 px) would cover each
  // other. Markers that would touch are set on a ring around where they are (in screen pixels, so
  // the ring keeps its size as the map zooms), each joined to its paper's point by a thin line.
  const MARKER_GAP = 3;
  let spreadAt = new Map();  // paper index -> [screen dx, dy] from its point to its marker
  const leaders = $("leaders");
  function spreadMarkers() {
    const items = [];
    for (const [list, L] of [[cited, citedLayer], [retrieved, retrievedLayer]])
      for (const i of list.slice(0, 200)) items.push({ i, x: toScreenX(X[i]), y: toScreenY(Y[i]), r: L.size() / 2 });
    const m = items.length, px = items.map((o) => o.x), py = items.map((o) => o.y);
    const touching = (a, b) => Math.hypot(px[a] - px[b], py[a] - py[b]) < items[a].r + items[b].r + MARKER_GAP;
    // Groups of markers that touch, each laid out on one ring around its papers' points; a ring that
    // touches another marker joins its group (groups only grow), so this ends within m passes.
    const group = items.map((_, k) => k), find = (k) => (group[k] === k ? k : (group[k] = find(group[k])));
    for (let pass = 0; pass <= m; pass++) {
      let any = false;
      for (let a = 0; a < m; a++) for (let b = a + 1; b < m; b++) if (touching(a, b)) { group[find(a)] = find(b); any = true; }
      if (!any) break;
      const members = new Map();
      for (let k = 0; k < m; k++) { const g = find(k); if (!members.has(g)) members.set(g, []); members.get(g).push(k); }
      for (const ks of members.values()) {
        if (ks.length < 2) continue;
        let cx = 0, cy = 0, step = 0;
        for (const k of ks) { cx += items[k].x; cy += items[k].y; step = Math.max(step, 2 * items[k].r + MARKER_GAP); }
        cx /= ks.length; cy /= ks.length;
        // Neighbours on the ring are one marker and a gap apart (the chord of 2*pi/m), a little more for safety.
        const radius = (1.05 * step) / (2 * Math.sin(Math.PI / Math.max(2, ks.length)));
        // Keep the papers' own order around the centre, so each marker stays on its point's side.
        const angle = (k) => Math.atan2(items[k].y - cy, items[k].x - cx) + (items[k].i % 997) * 1e-9;
        ks.sort((a, b) => angle(a) - angle(b));
        const start = angle(ks[0]);
        ks.forEach((k, j) => {
          const t = start + (2 * Math.PI * j) / ks.length;
          px[k] = cx + radius * Math.cos(t); py[k] = cy + radius * Math.sin(t);
        });
      }
    }
    spreadAt = new Map();
    const lines = [];
    for (let k = 0; k < m; k++) {
      const o = items[k], dx = px[k] - o.x, dy = py[k] - o.y, d = Math.hypot(dx, dy);
      if (d < 0.5) continue;
      spreadAt.set(o.i, [dx, dy]);
      if (d > o.r) {  // a line from the point to the marker's edge
        const ex = px[k] - (dx / d) * o.r, ey = py[k] - (dy / d) * o.r;
        lines.push("M" + o.x.toFixed(1) + " " + o.y.toFixed(1) + "L" + ex.toFixed(1) + " " + ey.toFixed(1));
      }
    }
    leaders.firstChild.setAttribute("d", lines.join(""));
    const at = (i) => { const s = spreadAt.get(i); return s ? [X[i] + s[0] / view.s, Y[i] - s[1] / view.s] : null; };
    fill(citedLayer, cited, CITED, at);
    fill(retrievedLayer, retrieved, RETRIEVED, at);
    if (selected >= 0) fill(selectedLayer, [selected], SELECTED, at);
  }
  // Where paper i is drawn on the screen: its marker when it has been moved aside, else its point.
  const drawnX = (i) => toScreenX(X[i]) + (spreadAt.has(i) ? spreadAt.get(i)[0] : 0);
  const drawnY = (i) => toScreenY(Y[i]) + (spreadAt.has(i) ? spreadAt.get(i)[1] : 0);

  // ------------------------------------------------------------------ cluster labels
  // Each label is tried at its cluster's centre, then on rings around it, slid inside the map's edges;
  // one that fits nowhere free (of the other labels, the answer's markers and the page's own boxes)
  // is hidden. The cluster of the open card goes first, so the cluster a card names is on the map.
  const labelBox = $("labels");
  const labels = [], labelOf = new Map();  // cluster index -> its label
  {
    const top = clusters.map((c, k) => ({ c, k }))
      .filter((o) => o.c && typeof o.c.label === "string" && o.c.label.trim())
      .sort((a, b) => (+b.c.size || 0) - (+a.c.size || 0))
      .slice(0, 400);
    const biggest = top.length ? Math.max(1, +top[0].c.size || 1) : 1;
    for (const o of top) {
      const el = document.createElement("div");
      el.className = "label";
      el.dir = "auto";
      el.textContent = o.c.label;
      el.style.fontSize = (11 + 4 * Math.sqrt(Math.max(0, +o.c.size || 0) / biggest)).toFixed(1) + "px";
      el.style.borderBottomColor = cssColor(clusterColor(o.k));
      el.dataset.cluster = String(o.k);
      labelBox.appendChild(el);
      const label = { el, k: o.k, x: +o.c.x || 0, y: +o.c.y || 0, w: 0, h: 0, shown: false };
      labels.push(label);
      labelOf.set(o.k, label);
    }
  }
  const LABEL_ONE_LINE = 200, LABEL_MAX = 260;  // px: a longer label takes two lines of about equal length
  function shapeLabel(el) {
    // The narrowest box (in 8 px steps) that holds the label in two lines: boxes hold text, not air.
    el.style.width = "";
    el.style.whiteSpace = "nowrap";
    const full = el.offsetWidth, line = el.offsetHeight;
    el.style.whiteSpace = "";
    if (full <= LABEL_ONE_LINE) return;
    for (let w = Math.ceil(full / 2) + 8; w < Math.min(full, LABEL_MAX); w += 8) {
      el.style.width = w + "px";
      if (el.offsetHeight <= 2 * line + 1) return;
    }
    el.style.width = "";  // max-width wraps it
  }
  function measureLabels() {  // again on resize: a map opened in a hidden tab measured nothing
    for (const o of labels) { shapeLabel(o.el); o.w = o.el.offsetWidth; o.h = o.el.offsetHeight; }
  }
  measureLabels();
  const boxOf = (id) => {
    const el = $(id);
    if (!el || el.hidden) return null;
    const r = el.getBoundingClientRect();
    return r.width && r.height ? { x: r.left, y: r.top, w: r.width, h: r.height } : null;
  };
  const EDGE = 4;  // px kept free between a label and the map's edge
  const OFFSETS = [[0, 0]];
  for (const ring of [1, 2, 3])
    for (let j = 0; j < 8; j++) OFFSETS.push([Math.cos((j * Math.PI) / 4) * ring, Math.sin((j * Math.PI) / 4) * ring]);
  function layoutLabels() {
    if (labels.some((o) => !o.w)) measureLabels();
    const placed = [];
    // The page's boxes over the map, and the answer's markers: no label covers them.
    for (const id of ["panel", "controls", "banner", "card"]) { const b = boxOf(id); if (b) placed.push(b); }
    for (const [list, L] of [[cited, citedLayer], [retrieved, retrievedLayer]]) {
      const r = L.size() / 2;
      for (const i of list.slice(0, 200))
        placed.push({ x: drawnX(i) - r, y: drawnY(i) - r, w: 2 * r, h: 2 * r });
    }
    const free = (x, y, w, h) => {
      for (const p of placed) {
        if (x < p.x + p.w + 6 && p.x < x + w + 6 && y < p.y + p.h + 4 && p.y < y + h + 4) return false;
      }
      return true;
    };
    const first = selected >= 0 && C[selected] >= 0 ? labelOf.get(C[selected]) : null;
    const order = first ? [first, ...labels.filter((o) => o !== first)] : labels;
    for (const o of order) {
      const cx = toScreenX(o.x), cy = toScreenY(o.y);
      // A label whose cluster's centre is off the map is not shown (the open card's, slid inside, is).
      const inView = cx >= 0 && cx <= W && cy >= 0 && cy <= H;
      let ok = false, x = 0, y = 0;
      if (o.w && o.h && o.w <= W - 2 * EDGE && o.h <= H - 2 * EDGE && (inView || o === first)) {
        for (const [dx, dy] of OFFSETS) {
          x = Math.min(Math.max(cx - o.w / 2 + dx * (o.w / 2 + 6), EDGE), W - EDGE - o.w);
          y = Math.min(Math.max(cy - o.h / 2 + dy * (o.h + 4), EDGE), H - EDGE - o.h);
          if ((ok = free(x, y, o.w, o.h))) break;
        }
      }
      if (ok) {
        placed.push({ x, y, w: o.w, h: o.h });
        o.el.style.transform = "translate(" + x.toFixed(1) + "px," + y.toFixed(1) + "px)";
      }
      if (ok !== o.shown) { o.el.style.visibility = ok ? "visible" : "hidden"; o.shown = ok; }
    }
    // The card names its paper's cluster only while that cluster's label is on the map.
    if (selected >= 0) {
      const c = C[selected] >= 0 ? clusters[C[selected]] : null, shown = !!(first && first.shown);
      setText("card-cluster", shown && c && typeof c.label === "string" ? c.label : "");
    }
  }

  // ------------------------------------------------------------------ frames
  let queued = false;
  function draw() {
    spreadMarkers();
    if (gl) drawGL(); else draw2D();
    layoutLabels();
  }
  function render() {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; draw(); });
  }
  function resize() {
    dpr = window.devicePixelRatio || 1;
    W = Math.max(1, canvas.clientWidth || window.innerWidth);
    H = Math.max(1, canvas.clientHeight || window.innerHeight);
    canvas.width = Math.max(1, Math.round(W * dpr));
    canvas.height = Math.max(1, Math.round(H * dpr));
    measureLabels();
    if (userMoved) { computeFit(); view.s = clampScale(view.s); render(); } else resetView();
  }

  // ------------------------------------------------------------------ hit testing: a uniform grid in data space
  const clampInt = (v, hi) => Math.max(0, Math.min(hi, v));
  const grid = (() => {
    const span = Math.max(maxX - minX, maxY - minY, 1e-9);
    const cells = Math.max(1, Math.ceil(Math.sqrt(n / 3)));
    const cell = span / cells;
    const gx = Math.floor((maxX - minX) / cell) + 1, gy = Math.floor((maxY - minY) / cell) + 1;
    const start = new Int32Array(gx * gy + 1), items = new Int32Array(n), cellOf = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      const cx = clampInt(Math.floor((X[i] - minX) / cell), gx - 1);
      cellOf[i] = clampInt(Math.floor((Y[i] - minY) / cell), gy - 1) * gx + cx;
      start[cellOf[i] + 1]++;
    }
    for (let k = 1; k < start.length; k++) start[k] += start[k - 1];
    const fillAt = start.slice(0, gx * gy);
    for (let i = 0; i < n; i++) items[fillAt[cellOf[i]]++] = i;
    return { cell, gx, gy, start, items };
  })();
  function nearest(sx, sy, radiusPx) {
    // Markers drawn above the others win wherever the pointer is on them.
    for (const [list, L] of [[cited, citedLayer], [retrieved, retrievedLayer]]) {
      let best = -1, bestD = Infinity;
      const r = L.size() / 2 + 1;
      for (const i of list) {
        const d = Math.hypot(drawnX(i) - sx, drawnY(i) - sy);
        if (d <= r && d < bestD) { best = i; bestD = d; }
      }
      if (best >= 0) return best;
    }
    if (!n) return -1;
    const dx = view.cx + (sx - W / 2) / view.s, dy = view.cy - (sy - H / 2) / view.s;
    const r = Math.max(radiusPx, base.size() / 2) / view.s;
    const x0 = clampInt(Math.floor((dx - r - minX) / grid.cell), grid.gx - 1);
    const x1 = clampInt(Math.floor((dx + r - minX) / grid.cell), grid.gx - 1);
    const y0 = clampInt(Math.floor((dy - r - minY) / grid.cell), grid.gy - 1);
    const y1 = clampInt(Math.floor((dy + r - minY) / grid.cell), grid.gy - 1);
    let best = -1, bestD = r * r;
    for (let cy = y0; cy <= y1; cy++) {
      for (let cx = x0; cx <= x1; cx++) {
        const c = cy * grid.gx + cx;
        for (let k = grid.start[c]; k < grid.start[c + 1]; k++) {
          const i = grid.items[k], ex = X[i] - dx, ey = Y[i] - dy, d = ex * ex + ey * ey;
          if (d <= bestD) { bestD = d; best = i; }
        }
      }
    }
    return best;
  }

  // ------------------------------------------------------------------ tooltip and card
  const tip = $("tooltip");
  const titleOf = (i) => titles[i] || ids[i] || "(untitled)";
  function showTip(i, cx, cy) {
    tip.textContent = titleOf(i);
    tip.hidden = false;
    const w = tip.offsetWidth, h = tip.offsetHeight;
    let x = cx + 14, y = cy + 16;
    if (x + w > window.innerWidth - 4) x = Math.max(4, cx - w - 14);
    if (y + h > window.innerHeight - 4) y = Math.max(4, cy - h - 12);
    tip.style.transform = "translate(" + x + "px," + y + "px)";
  }
  function hideTip() { tip.hidden = true; }

  const card = $("card"), link = $("card-link");
  function setText(id, text) {
    const el = $(id);
    el.textContent = text || "";
    el.hidden = !text;
  }
  function openCard(i) {
    selected = i;
    fill(selectedLayer, [i], SELECTED);
    $("card-title").textContent = titleOf(i);
    setText("card-authors", authors[i]);
    setText("card-meta", [venues[i], years[i]].filter(Boolean).join(" \u00b7 "));
    const url = urls[i] || "";
    if (/^https?:\/\//i.test(url)) {
      link.href = url;
      let host = url;
      try { host = new URL(url).host; } catch (err) { /* shown as written */ }
      link.textContent = "Open paper \u2197 " + host;
      link.hidden = false;
    } else {
      link.removeAttribute("href");
      link.hidden = true;
    }
    setText("card-abstract", abstracts ? abstracts[i] : "");
    const c = C[i] >= 0 ? clusters[C[i]] : null;
    setText("card-cluster", c && typeof c.label === "string" ? c.label : "");
    if (c) $("card-cluster").style.borderLeftColor = cssColor(clusterColor(C[i]));
    const status = cited.includes(i) ? "Cited in the answer" : retrieved.includes(i) ? "Retrieved, not cited" : "";
    setText("card-status", status);
    card.dataset.id = ids[i];
    card.hidden = false;
    document.body.classList.add("card-open");
    render();
    return true;
  }
  function closeCard() {
    card.hidden = true;
    document.body.classList.remove("card-open");
    selected = -1;
    fill(selectedLayer, [], SELECTED);
    render();
  }
  $("card-close").addEventListener("click", closeCard);
  function focusPaper(i) {
    view.s = clampScale(Math.max(view.s, fitS * 3));
    // On a wide window the card covers the right: centre the paper in what stays visible.
    const shift = W > 720 ? 190 : 0;
    view.cx = X[i] + shift / view.s;
    view.cy = Y[i];
    userMoved = true;
    openCard(i);
  }

  // ------------------------------------------------------------------ search
  const input = $("search"), countEl = $("search-count"), results = $("results");
  let haystack = null, abstractStack = null;
  const SNIPPET = 44;  // characters of abstract shown on each side of a match
  function snippet(text, at, len) {
    // "…words before MATCH words after…", the match in <mark> (built as nodes: the text stays text)
    const from = Math.max(0, at - SNIPPET), to = Math.min(text.length, at + len + SNIPPET);
    const s = document.createElement("span"), mark = document.createElement("mark");
    s.className = "s where";
    mark.textContent = text.slice(at, at + len);
    s.append("abstract: " + (from > 0 ? "\u2026" : "") + text.slice(from, at), mark,
      text.slice(at + len, to) + (to < text.length ? "\u2026" : ""));
    return s;
  }
  function search(text) {
    text = text == null ? "" : String(text);
    if (input.value !== text) input.value = text;
    const q = text.trim().toLowerCase();
    results.replaceChildren();
    if (!q) {
      matches = null;
      fill(matchLayer, [], null);
      countEl.textContent = "";
      document.body.classList.remove("filtering");
      render();
      return 0;
    }
    if (!haystack) {
      haystack = new Array(n);
      for (let i = 0; i < n; i++) haystack[i] = ((titles[i] || "") + "\u0000" + (authors[i] || "")).toLowerCase();
      // Abstracts too, when the page has them: a method named only in an abstract is found.
      if (abstracts) { abstractStack = new Array(n); for (let i = 0; i < n; i++) abstractStack[i] = (abstracts[i] || "").toLowerCase(); }
    }
    // Papers whose title or authors match come first; then those that match in the abstract only.
    const found = [], inAbstract = [], where = new Map();
    for (let i = 0; i < n; i++) {
      if (haystack[i].includes(q)) found.push(i);
      else if (abstractStack) { const at = abstractStack[i].indexOf(q); if (at >= 0) { inAbstract.push(i); where.set(i, at); } }
    }
    const all = found.concat(inAbstract);
    matches = all;
    fill(matchLayer, all, null);
    const m = all.length;
    countEl.textContent = (m === 0 ? "No papers match" : m === 1 ? "1 paper matches" : fmt(m) + " papers match") +
      (inAbstract.length ? (inAbstract.length === m ? ", in the abstract" + (m === 1 ? "" : "s")
        : " (" + fmt(inAbstract.length) + " in the abstract only)") : "");
    for (const i of all.slice(0, 20)) {
      const li = document.createElement("li"), b = document.createElement("button"), t = document.createElement("span");
      b.type = "button";
      t.className = "t"; t.dir = "auto"; t.textContent = titleOf(i);
      let s;
      if (where.has(i)) {
        s = snippet(abstracts[i] || "", where.get(i), q.length);
      } else {
        s = document.createElement("span");
        s.className = "s"; s.textContent = [authors[i], years[i]].filter(Boolean).join(" \u00b7 ");
      }
      b.title = titleOf(i);
      b.append(t, s);
      b.addEventListener("click", () => focusPaper(i));
      li.appendChild(b);
      results.appendChild(li);
    }
    document.body.classList.add("filtering");
    render();
    return m;
  }
  input.addEventListener("input", () => search(input.value));
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && matches && matches.length) focusPaper(matches[0]);
    if (e.key === "Escape") search("");
  });

  // ------------------------------------------------------------------ highlight
  const asIds = (v) => (Array.isArray(v) ? v.filter((x) => typeof x === "string" || typeof x === "number") : []);
  function highlight(h) {
    h = h && typeof h === "object" ? h : {};
    const seen = new Set(), pick = (list) => {
      const out = [];
      for (const id of asIds(list)) {
        const i = byId.get(String(id));
        if (i !== undefined && !seen.has(i)) { seen.add(i); out.push(i); }
      }
      return out;
    };
    cited = pick(h.cited);
    retrieved = pick(h.retrieved);  // a paper both cited and retrieved is shown as cited
    fill(citedLayer, cited, CITED);
    fill(retrievedLayer, retrieved, RETRIEVED);
    const q = typeof h.question === "string" ? h.question.trim() : "";
    $("question").textContent = q;
    $("question").title = q;
    $("question").hidden = !q;
    $("n-cited").textContent = "(" + cited.length + ")";
    $("n-retrieved").textContent = "(" + retrieved.length + ")";
    $("banner").hidden = !(q || cited.length || retrieved.length);
    $("banner-label").textContent = q ? "Papers of the answer to" : "Papers of the answer";
    if (selected >= 0) openCard(selected);
    render();
    return highlighted();
  }
  const highlighted = () => ({ cited: cited.map((i) => ids[i]), retrieved: retrieved.map((i) => ids[i]) });
  $("banner-clear").addEventListener("click", () => highlight({}));

  // ------------------------------------------------------------------ pointer: drag pans, wheel zooms, click opens
  const pointers = new Map();
  let drag = null;
  const local = (e) => { const r = canvas.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
  function bindPointer() {
    canvas.addEventListener("pointerdown", (e) => {
      if (e.pointerType === "mouse" && e.button !== 0) return;
      canvas.setPointerCapture(e.pointerId);
      pointers.set(e.pointerId, { x: e.clientX, y: e.clientY });
      drag = pointers.size === 1 ? { moved: 0 } : null;
      hideTip();
    });
    canvas.addEventListener("pointermove", (e) => {
      const p = pointers.get(e.pointerId);
      if (!p) {
        const [sx, sy] = local(e), i = nearest(sx, sy, 8);
        canvas.classList.toggle("over-point", i >= 0);
        if (i >= 0) showTip(i, e.clientX, e.clientY); else hideTip();
        return;
      }
      if (pointers.size === 2) {
        const other = [...pointers.values()].find((q) => q !== p);
        const d0 = Math.hypot(p.x - other.x, p.y - other.y), d1 = Math.hypot(e.clientX - other.x, e.clientY - other.y);
        const r = canvas.getBoundingClientRect();
        panBy((e.clientX - p.x) / 2, (e.clientY - p.y) / 2);
        if (d0 > 0 && d1 > 0) zoomAt((e.clientX + other.x) / 2 - r.left, (e.clientY + other.y) / 2 - r.top, d1 / d0);
      } else if (drag) {
        drag.moved += Math.abs(e.clientX - p.x) + Math.abs(e.clientY - p.y);
        if (drag.moved > 4) canvas.classList.add("dragging");
        panBy(e.clientX - p.x, e.clientY - p.y);
      }
      p.x = e.clientX; p.y = e.clientY;
    });
    const end = (e) => {
      if (!pointers.delete(e.pointerId)) return;
      if (e.type === "pointerup" && drag && drag.moved <= 4) {
        const [sx, sy] = local(e), i = nearest(sx, sy, 8);
        if (i >= 0) openCard(i);
      }
      if (!pointers.size) { drag = null; canvas.classList.remove("dragging"); }
    };
    canvas.addEventListener("pointerup", end);
    canvas.addEventListener("pointercancel", end);
    canvas.addEventListener("pointerleave", () => { if (!pointers.size) hideTip(); });
    canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      const unit = e.deltaMode === 1 ? 0.05 : e.deltaMode === 2 ? 1 : 0.0015;
      const [sx, sy] = local(e);
      hideTip();
      zoomAt(sx, sy, Math.exp(-e.deltaY * unit));
    }, { passive: false });
    canvas.addEventListener("dblclick", (e) => { e.preventDefault(); resetView(); });
  }
  $("reset").addEventListener("click", resetView);
  $("zoom-in").addEventListener("click", () => zoomAt(W / 2, H / 2, 1.6));
  $("zoom-out").addEventListener("click", () => zoomAt(W / 2, H / 2, 1 / 1.6));
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && !card.hidden) closeCard(); });
  window.addEventListener("resize", resize);

  // ------------------------------------------------------------------ start
  if (abstracts) {  // the box says what it searches
    input.placeholder = "Search titles, authors, abstracts";
    input.setAttribute("aria-label", "Search titles, authors and abstracts");
  }
  $("title").textContent = typeof data.title === "string" && data.title ? data.title : "Map of " + fmt(n) + " papers";
  $("subtitle").textContent = fmt(n) + (n === 1 ? " paper" : " papers") + " \u00b7 " + fmt(clusters.length) +
    (clusters.length === 1 ? " cluster" : " clusters");
  startRenderer();
  bindPointer();
  const h0 = data.highlight && typeof data.highlight === "object" ? data.highlight : {};
  highlight({ cited: h0.cited, retrieved: h0.retrieved, question: data.question });
  resize();
  draw();  // the first frame now, not on the next animation frame: `ready` means something is drawn

  const origin = self.origin || location.origin;  // self.origin is right for srcdoc frames too
  const framed = window.parent !== window;
  window.addEventListener("message", (e) => {
    if (!framed || e.source !== window.parent) return;
    if (origin !== "null" && e.origin !== origin) return;
    const m = e.data;
    if (!m || typeof m !== "object" || m.type !== "rag-map-highlight") return;
    highlight({ cited: m.cited, retrieved: m.retrieved, question: m.question });
  });
  Object.assign(api, {
    highlight, highlighted, search, resetView,
    select: (id) => { const i = byId.get(String(id)); return i === undefined ? false : openCard(i); },
    // The answer's markers as drawn: centre (x, y) and radius in page pixels, and the paper's point (px, py).
    markers: () => {
      const r = canvas.getBoundingClientRect(), out = [];
      for (const [kind, list, L] of [["cited", cited, citedLayer], ["retrieved", retrieved, retrievedLayer]])
        for (const i of list) out.push({ id: ids[i], kind, x: r.left + drawnX(i), y: r.top + drawnY(i), r: L.size() / 2,
          px: r.left + toScreenX(X[i]), py: r.top + toScreenY(Y[i]) });
      return out;
    },
    screenPosition: (id) => {
      const i = byId.get(String(id));
      if (i === undefined) return null;
      const r = canvas.getBoundingClientRect();
      return { x: r.left + drawnX(i), y: r.top + drawnY(i) };
    },
  });
  api.ready = true;
  document.body.dataset.ready = "true";
  if (framed && origin !== "null") {
    try { window.parent.postMessage({ type: "rag-map-ready" }, origin); } catch (err) { /* parent gone */ }
  }
})();
