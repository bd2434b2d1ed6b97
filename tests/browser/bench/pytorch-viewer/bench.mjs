// Benchmark (not a test) of PyTorch's own snapshot viewer, MemoryViz.js (what
// pytorch.org/memory_viz runs), in headless Chromium, so that our viewer's load time can be
// compared with it on the same file. Entry point: scripts/bench-pytorch-viewer.sh.
// Env: MEMORYVIZ_JS (path to PyTorch's MemoryViz.js, never kept in this repository),
// FILES (space-separated .pickle paths), ROUND (a label for the output), TIMEOUT_S (default 180),
// SCREENSHOTS (a folder for a picture of each drawn page).
//
// The page is pytorch.org/memory_viz (a body holding one module script: MemoryViz.js) plus a
// hidden file input: choosing a file there drops it on the body, which is how a user loads a
// snapshot on the real page (it has no file picker). MemoryViz then reads the
// file, unpickles and annotates it and builds the default view, the Active Memory Timeline, all
// in the FileReader's load handler.
//
// One JSON line per file: first_timeline_ms is the time from the input's change event to the end
// of the first frame that shows the timeline: the load handler has returned (the timeline's SVG
// polygons are in the DOM), then the next animation frame's callbacks, style, layout and paint
// have run (a timeout posted from requestAnimationFrame runs after them). The harness checks
// that the timeline SVG then holds polygons; rasterising and showing the frame happen off the
// main thread and are not counted. phases_ms gives the time of each step since the change event,
// observed from outside MemoryViz.js (it is loaded unmodified), see PROBES below.
// A timeout or a crashed page is a result: status says which.
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { cacheFile, launch } from '../../lib.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const MODULES = path.join(HERE, 'node_modules');
const MEMORYVIZ = process.env.MEMORYVIZ_JS;
const FILES = (process.env.FILES || '').split(/\s+/).filter(Boolean);
const TIMEOUT_MS = Number(process.env.TIMEOUT_S || 180) * 1000;
const MiB = 1024 * 1024;

if (!MEMORYVIZ || !fs.existsSync(MEMORYVIZ)) {
  console.error('MEMORYVIZ_JS must name PyTorch\'s MemoryViz.js');
  process.exit(2);
}
if (!FILES.length) {
  console.error('FILES must name at least one .pickle snapshot');
  process.exit(2);
}

// MemoryViz imports d3 from cdn.skypack.dev (d3@5 and single d3-* packages at a major version),
// which this machine cannot reach. An import map sends each of those URLs to the npm package of
// that name and major version, and every bare `d3-*` specifier inside the packages to the one
// installed copy, so that all of them share one d3-selection: MemoryViz reads `d3.event`, a
// live binding that only the d3-selection instance dispatching the event sets (with two copies,
// zooming and brushing the timeline would fail).
function packages() {
  const out = [];
  for (const dir of fs.readdirSync(MODULES)) {
    const pj = path.join(MODULES, dir, 'package.json');
    if (!dir.startsWith('d3') || !fs.existsSync(pj)) continue;
    const p = JSON.parse(fs.readFileSync(pj, 'utf8'));
    // `module` is the ES source (d3 v5-era packages ship it next to their UMD build).
    const entry = p.module || p['jsnext:main'];
    if (!entry) throw new Error(`${dir} has no ES module entry`);
    out.push({ dir, name: p.name, major: p.version.split('.')[0], url: `/node_modules/${dir}/${entry.replace(/^\.\//, '')}` });
  }
  return out;
}

function importMap(source) {
  const pkgs = packages();
  const imports = {};
  // Bare specifiers: the folder named like the package (an npm alias such as d3-scale-1 only
  // serves MemoryViz's own import of an older major).
  for (const p of pkgs) if (p.dir === p.name) imports[p.name] = p.url;
  for (const [, url, name, major] of source.matchAll(/from\s+"(https:\/\/cdn\.skypack\.dev\/([^@"]+)@(\d+))"/g)) {
    const p = pkgs.find((x) => x.name === name && x.major === major);
    if (!p) throw new Error(`no installed ${name}@${major} for MemoryViz's import of ${url} (add it to package.json)`);
    imports[url] = p.url;
  }
  return { imports };
}

// pytorch.org/memory_viz (pytorch/pytorch.github.io memory_viz.html) is only
// `<html><body><script type="module" src=".../MemoryViz.js"></script></body>`.
// Added here: the import map, and the file input that drops the chosen file on the body.
function pageHtml(map) {
  return `<!DOCTYPE html>
<html>
<body>
<script type="importmap">${JSON.stringify(map)}</script>
<input type="file" id="pick" hidden>
<script>
document.getElementById('pick').addEventListener('change', (e) => {
  const dt = new DataTransfer();
  for (const f of e.target.files) dt.items.add(f);
  for (const type of ['dragover', 'drop']) {
    document.body.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
  }
});
</script>
<script type="module" src="/MemoryViz.js"></script>
</body>
`;
}

// PROBES, installed before the page's scripts; none changes what MemoryViz does.
// - chosen: the input's change event (capture phase, before the drop).
// - read: the FileReader's load event, before MemoryViz's own handler (MemoryViz sets
//   reader.onload, then calls readAsArrayBuffer: the wrapper replaces that handler).
// - unpickled: unpickle_and_annotate logs the unpickled object before annotating it.
// - annotated: snapshot_change's first DOM call, gpu.selectAll('option'), right after annotation.
// - processed: create_trace_view's first DOM call, dst.selectAll('svg'), right after
//   process_alloc_data.
// - js_done: MemoryViz's load handler has returned (the whole view is built).
// - painted: the next frame has been laid out and painted, see the top of this file.
function probes() {
  const pv = (window.__pv = { chosen: null, marks: {} });
  const mark = (name) => {
    if (pv.chosen === null || name in pv.marks) return;
    pv.marks[name] = performance.now();
    performance.mark(`pytorch-viewer:${name}`);
  };
  document.addEventListener('change', () => { pv.chosen = performance.now(); }, true);
  const read = FileReader.prototype.readAsArrayBuffer;
  FileReader.prototype.readAsArrayBuffer = function (blob) {
    const handler = this.onload;
    if (typeof handler === 'function') {
      this.onload = function (e) {
        mark('read');
        const r = handler.call(this, e);
        mark('js_done');
        requestAnimationFrame(() => setTimeout(() => mark('painted'), 0));
        return r;
      };
    }
    return read.call(this, blob);
  };
  const log = console.log;
  console.log = function (...args) {
    const d = args[0];
    if (d && typeof d === 'object' && Array.isArray(d.device_traces) && !('unpickled' in pv.marks)) {
      mark('unpickled');
      pv.traceEvents = d.device_traces.reduce((n, t) => n + t.length, 0);
      pv.segments = Array.isArray(d.segments) ? d.segments.length : null;
    }
    return log.apply(this, args);
  };
  const qsa = Element.prototype.querySelectorAll;
  Element.prototype.querySelectorAll = function (sel) {
    if ('unpickled' in pv.marks) {
      if (sel === 'option' && this.localName === 'select') mark('annotated');
      else if (sel === 'svg') mark('processed');
    }
    return qsa.call(this, sel);
  };
}

// Static server: the page, MemoryViz.js, and the d3 packages. d3 v5-era sources import their own
// files without the `.js` extension (`./src/band`), which a bundler resolves: so does this
// server. It notes every URL a file was served under, since two URLs for one file would make
// two module instances.
const served = new Map();
function serve(html) {
  const server = http.createServer((req, res) => {
    const p = decodeURIComponent(new URL(req.url, 'http://localhost').pathname);
    const send = (file, type) => {
      if (!served.has(file)) served.set(file, new Set());
      served.get(file).add(p);
      res.writeHead(200, { 'content-type': type, 'cache-control': 'no-store' });
      fs.createReadStream(file).pipe(res);
    };
    if (p === '/') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' }).end(html);
    } else if (p === '/MemoryViz.js') {
      send(MEMORYVIZ, 'text/javascript');
    } else if (p.startsWith('/node_modules/')) {
      const base = path.join(MODULES, path.normalize(p.slice('/node_modules/'.length)));
      const file = [base, `${base}.js`, path.join(base, 'index.js')]
        .find((f) => f.startsWith(MODULES) && fs.existsSync(f) && fs.statSync(f).isFile());
      if (file) send(file, 'text/javascript');
      else res.writeHead(404).end();
    } else if (p === '/favicon.ico') {
      // Chromium asks for it; a 404 would show up as a console error.
      res.writeHead(204).end();
    } else {
      res.writeHead(404).end();
    }
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

const source = fs.readFileSync(MEMORYVIZ, 'utf8');
const server = await serve(pageHtml(importMap(source)));
const BASE = `http://127.0.0.1:${server.address().port}/`;

for (const file of FILES) {
  const bytes = fs.statSync(file).size;
  const { ctx, close } = await launch();
  const page = await ctx.newPage();
  const problems = [];
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') problems.push(`${m.type()}: ${m.text()} (${m.location().url})`);
  });
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', (r) => { if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`); });
  let pageError = null;
  const errored = new Promise((resolve) => page.on('pageerror', (e) => { pageError = String(e.message || e); resolve('error'); }));
  const crashed = new Promise((resolve) => page.on('crash', () => resolve('crash')));
  await page.addInitScript(probes);
  const cdp = await ctx.newCDPSession(page);
  await cdp.send('Performance.enable');
  await page.goto(BASE);
  // MemoryViz has run its top level once it has added its three <select>s.
  await page.waitForFunction(() => document.querySelectorAll('body > select').length === 3, null, { timeout: 60_000 });

  // The page at rest, before the file is chosen.
  const idleHeap = (await cdp.send('Performance.getMetrics')).metrics.find((x) => x.name === 'JSHeapUsedSize')?.value ?? 0;

  // JS heap, sampled from outside the page: MemoryViz's load is one long task, and
  // Performance.getMetrics is answered while a task runs (a timer in the page would not be).
  // Each sample keeps its time on the page's clock (performance.now() counts from navigation
  // start) to tell how many were taken during the load task.
  let heapMax = 0;
  const samples = [];
  const sampler = setInterval(async () => {
    try {
      const m = Object.fromEntries((await cdp.send('Performance.getMetrics')).metrics.map((x) => [x.name, x.value]));
      if (m.JSHeapUsedSize) {
        heapMax = Math.max(heapMax, m.JSHeapUsedSize);
        samples.push((m.Timestamp - m.NavigationStart) * 1000);
      }
    } catch { /* page busy, crashed or closing */ }
  }, 100);

  cacheFile(file);
  const t0 = Date.now();
  await page.setInputFiles('#pick', file);
  const status = await Promise.race([
    page.waitForFunction(() => 'painted' in window.__pv.marks, null, { timeout: TIMEOUT_MS, polling: 50 })
      .then(() => 'ok', (e) => (e.name === 'TimeoutError' ? 'timeout' : `failed: ${e.message.split('\n')[0]}`)),
    crashed,
    errored,
  ]);
  const wallMs = Date.now() - t0;
  clearInterval(sampler);

  // What the page holds now; a page still busy (timeout) or gone (crash) may not answer. Counting
  // the points of a large timeline takes a while, hence the longer wait after a draw.
  const state = status === 'crash' ? null : await Promise.race([
    page.evaluate(() => {
      const plot = document.querySelector('svg[viewBox="0 0 1024 576"]');
      const polygons = plot ? [...plot.querySelectorAll('polygon')] : [];
      const range = document.querySelector('input[type="range"]');
      return {
        chosen: window.__pv.chosen,
        marks: window.__pv.marks,
        traceEvents: window.__pv.traceEvents,
        segments: window.__pv.segments,
        polygons: polygons.length,
        points: polygons.reduce((n, p) => n + p.points.numberOfItems, 0),
        allocations: range ? Number(range.getAttribute('max')) : null,
        view: document.querySelectorAll('body > select')[1].value,
        heapUsed: performance.memory.usedJSHeapSize,
      };
    }),
    new Promise((resolve) => setTimeout(() => resolve(null), status === 'ok' ? 120_000 : 5000)),
  ]).catch(() => null);
  if (!state && status !== 'crash') problems.push('could not read the page after the load');
  // SCREENSHOTS=dir keeps a picture of what was drawn (taken after the measurement).
  if (process.env.SCREENSHOTS && status === 'ok') {
    fs.mkdirSync(process.env.SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: path.join(process.env.SCREENSHOTS, `${path.basename(file)}-${process.env.ROUND || 1}.png`), timeout: 60_000 })
      .catch((e) => problems.push(`screenshot: ${e.message.split('\n')[0]}`));
  }
  let result = status;
  if (status === 'ok' && state && !(state.polygons > 0)) result = 'no_timeline';
  const phases = {};
  if (state?.chosen != null) {
    for (const [name, at] of Object.entries(state.marks)) phases[name] = Math.round(at - state.chosen);
  }
  const out = {
    viewer: 'pytorch-memoryviz',
    round: process.env.ROUND ? Number(process.env.ROUND) : undefined,
    input: path.basename(file),
    trace_mib: +(bytes / MiB).toFixed(1),
    status: result,
    timeout_s: result === 'timeout' ? TIMEOUT_MS / 1000 : undefined,
    error: pageError ?? undefined,
    first_timeline_ms: result === 'ok' ? phases.painted : undefined,
    // From the setInputFiles call to the harness seeing the painted mark (polls every 50 ms).
    wall_ms: wallMs,
    phases_ms: phases,
    trace_events: state?.traceEvents,
    segments: state?.segments,
    allocations: state?.allocations ?? undefined,
    timeline_polygons: state?.polygons,
    timeline_points: state?.points,
    view: state?.view,
    idle_js_heap_mib: +(idleHeap / MiB).toFixed(1),
    js_heap_max_mib: +(heapMax / MiB).toFixed(1),
    js_heap_samples: samples.length,
    // Samples between the file read and the end of MemoryViz's load handler (its one long task).
    js_heap_samples_in_load: state?.marks.js_done ? samples.filter((t) => t > state.marks.read && t < state.marks.js_done).length : undefined,
    js_heap_after_mib: state ? +(state.heapUsed / MiB).toFixed(1) : undefined,
    memory_per_trace_byte: +(heapMax / bytes).toFixed(2),
    problems: problems.length ? problems.slice(0, 10) : undefined,
  };
  console.log(JSON.stringify(out));
  await close();
}

// Every module file must have been served under one URL (one instance per module).
for (const [file, urls] of served) {
  if (urls.size > 1) console.error(`warning: ${path.relative(HERE, file)} served as ${[...urls].join(', ')}`);
}
server.close();
