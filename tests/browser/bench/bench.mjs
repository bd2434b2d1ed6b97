// Viewer benchmark in headless Chromium (not a test: it prints numbers).
// Env: BASE_URL (served app), TRACES (dir with bench-<N>.msgpack files), SIZES (e.g. "1000000 10000000").
// For each trace: time from choosing the file (input change event) to the first drawn timeline,
// the frame time of zoom steps (with the call sites stacked), the time to build the call sites'
// series, and memory (wasm linear memory, JS heap) relative to trace size.
// The file is chosen IDLE_MS (default 1000) after the page has started, like a user who takes a
// second to pick it (a build whose root element gets `data-warm`, one from before the idle
// warm-up was removed, is waited for until `data-warm="done"` as well, as it was measured then);
// COLD=1 chooses it as soon as the picker exists instead. Memory is sampled just before the file
// is chosen (idle) and after the load (WebAssembly memory never shrinks: its size is the peak).
import fs from 'node:fs';
import path from 'node:path';
import { cacheFile, launch } from '../lib.mjs';

const BASE = process.env.BASE_URL;
const TRACES = process.env.TRACES;
const SIZES = (process.env.SIZES || '1000000 10000000').split(/\s+/).filter(Boolean);
const ZOOM_STEPS = 12;
const MiB = 1024 * 1024;

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };

// FILES (space-separated paths, e.g. PyTorch snapshots) replaces the synthetic traces.
const FILES = (process.env.FILES || '').split(/\s+/).filter(Boolean);
const inputs = FILES.length ? FILES : SIZES.map((n) => path.join(TRACES, `bench-${n}.msgpack`));

for (const file of inputs) {
  const n = FILES.length ? path.basename(file) : path.basename(file).replace(/^bench-|\.msgpack$/g, '');
  const bytes = fs.statSync(file).size;
  const { ctx, close } = await launch();
  const page = await ctx.newPage();
  await page.addInitScript(() => {
    addEventListener('TrunkApplicationStarted', (e) => { window.__wasm = e.detail.wasm; });
    document.addEventListener('change', () => { window.__chosen = performance.now(); window.__firstDraw = null; }, true);
    // The first draw after choosing the file (the detectors' markers redraw it later).
    new MutationObserver((records) => {
      for (const r of records) {
        if (window.__chosen && !window.__firstDraw && r.target.dataset?.testid === 'timeline-canvas' && r.target.isConnected) {
          const first = (window.__firstDraw = { at: Number(r.target.dataset.drawnAt), ms: Number(r.target.dataset.drawMs), painted: null });
          // The end of the frame that shows it (the end point PyTorch's viewer is measured to,
          // tests/browser/bench/pytorch-viewer/bench.mjs): the canvas is drawn in an animation frame's
          // callback, then that frame's style, layout, paint and commit run in the same task,
          // then this one. It is posted with the highest priority: the detectors' run, queued in
          // the same frame to start after it, must not be counted as painting.
          scheduler.postTask(() => { first.painted = performance.now(); }, { priority: 'user-blocking' });
        }
      }
    }).observe(document, { attributes: true, attributeFilter: ['data-drawn-at'], subtree: true });
  });
  const cdp = await ctx.newCDPSession(page);
  await cdp.send('Performance.enable');
  await page.goto(`${BASE}#view=timeline`);
  await page.waitForSelector('[data-testid="file-picker"]', { state: 'attached' });
  let warmMs = null;
  if (!process.env.COLD) {
    await page.waitForTimeout(Number(process.env.IDLE_MS || 1000));
    if (await page.locator('html[data-warm]').count()) {
      await page.waitForSelector('html[data-warm="done"]', { state: 'attached', timeout: 60_000 });
      warmMs = await page.evaluate(() => Math.round(performance.now()));
    }
  }
  const idleWasm = await page.evaluate(() => window.__wasm?.memory?.buffer?.byteLength ?? 0);
  const idleHeap = (await cdp.send('Performance.getMetrics')).metrics.find((x) => x.name === 'JSHeapUsedSize')?.value ?? 0;
  let heapMax = 0;
  const sampler = setInterval(async () => {
    try {
      const m = await cdp.send('Performance.getMetrics');
      const h = m.metrics.find((x) => x.name === 'JSHeapUsedSize');
      if (h) heapMax = Math.max(heapMax, h.value);
    } catch { /* page busy or closing */ }
  }, 100);
  cacheFile(file);
  await page.setInputFiles('[data-testid="file-picker"]', file);
  await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-drawn-at]', { timeout: 600_000 });
  await page.waitForFunction(() => window.__firstDraw?.painted, null, { timeout: 600_000 });
  const first = await page.evaluate(() => ({ chosen: window.__chosen, drawn: window.__firstDraw.at, painted: window.__firstDraw.painted, drawMs: window.__firstDraw.ms }));
  // The detectors run after the first draw: wait for them, then read the viewer's marks
  // (viewer/src/app/load.rs and mod.rs): file read, decoded or converted, tables built,
  // detectors done.
  await page.waitForFunction(() => performance.getEntriesByName('gpucollect:analysed')
    .some((m) => m.startTime >= window.__chosen), null, { timeout: 600_000 });
  first.phases = await page.evaluate(() => {
    const phases = {};
    for (const m of performance.getEntriesByType('mark')) {
      if (m.name.startsWith('gpucollect:') && m.startTime >= window.__chosen) {
        // Marks set many times (one per file slice) give their first time too.
        const name = m.name.slice(11);
        if (name in phases && !(`${name}-first` in phases)) phases[`${name}-first`] = phases[name];
        phases[name] = Math.round(m.startTime - window.__chosen);
      }
    }
    return phases;
  });
  // Let the redraw with the detectors' markers happen before the zoom steps, and the one with the
  // call sites stacked (their series are built two frames after the first draw).
  await page.waitForTimeout(200);
  if (await page.locator('canvas[data-testid="timeline-canvas"][data-stacked]').count()) {
    await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-stacked="true"]', { timeout: 600_000 });
  }
  const siteSeriesMs = await page.evaluate(() => Number(document.querySelector('[data-testid="timeline-canvas"]').dataset.siteSeriesMs ?? NaN));
  // Zoom steps: key '+' (zoom around the middle), measured from the key event to the next frame.
  // Every animation frame's start is recorded meanwhile, so that each step's draw can be placed
  // in its frame: the frame held when the next one starts one frame interval later (the draw
  // and its paint fit in it), and was missed when a frame had to be skipped.
  await page.evaluate(() => {
    window.__benchFrames = [];
    const tick = (t) => { window.__benchFrames.push(t); requestAnimationFrame(tick); };
    requestAnimationFrame(tick);
  });
  const steps = [];
  const draws = [];
  const drawSpans = [];
  for (let i = 0; i < ZOOM_STEPS; i++) {
    const r = await page.evaluate(async (key) => {
      const c = document.querySelector('[data-testid="timeline-canvas"]');
      const before = c.dataset.drawnAt;
      const t0 = performance.now();
      window.dispatchEvent(new KeyboardEvent('keydown', { key, bubbles: true }));
      await new Promise((res) => requestAnimationFrame(() => setTimeout(res, 0)));
      const frame = performance.now() - t0;
      const end = Number(c.dataset.drawnAt);
      const draw = Number(c.dataset.drawMs);
      return { frame, draw, start: end - draw, end, redrawn: c.dataset.drawnAt !== before };
    }, i < ZOOM_STEPS / 2 ? '+' : '-');
    if (r.redrawn) { steps.push(r.frame); draws.push(r.draw); drawSpans.push([r.start, r.end]); }
  }
  // The frame after the last one that drew, so that its end is recorded too.
  const frameStarts = await page.evaluate(async () => {
    await new Promise((res) => requestAnimationFrame(() => requestAnimationFrame(res)));
    return window.__benchFrames;
  });
  // The nominal frame interval (the display's, 16.7 ms at 60 Hz): the median between frames.
  const interval = median(frameStarts.slice(1).map((t, k) => t - frameStarts[k]));
  // Per step, from the start of the frame that drew to the start of the next one.
  const drawFrames = drawSpans.map(([start, end]) => {
    const from = frameStarts.filter((t) => t <= start + 0.5).at(-1);
    const to = frameStarts.find((t) => t > end);
    return from === undefined || to === undefined ? NaN : to - from;
  });
  const missed = drawFrames.filter((d) => !(d < 1.5 * interval)).length;
  const wasmBytes = await page.evaluate(() => window.__wasm?.memory?.buffer?.byteLength ?? 0);
  clearInterval(sampler);
  const out = {
    build: process.env.BUILD || undefined,
    round: process.env.ROUND ? Number(process.env.ROUND) : undefined,
    input: FILES.length ? n : undefined,
    events: FILES.length ? undefined : Number(n),
    trace_mib: +(bytes / MiB).toFixed(1),
    warm_up_done_ms: warmMs ?? undefined,
    idle_wasm_memory_mib: +(idleWasm / MiB).toFixed(1),
    idle_js_heap_mib: +(idleHeap / MiB).toFixed(1),
    first_timeline_ms: Math.round(first.drawn - first.chosen),
    // Up to the end of the frame that shows it (the end point of PyTorch's viewer's benchmark).
    first_painted_ms: Math.round(first.painted - first.chosen),
    first_draw_ms: +first.drawMs.toFixed(1),
    phases_ms: first.phases,
    zoom_steps: steps.length,
    zoom_frame_ms_median: +median(steps).toFixed(1),
    zoom_frame_ms_max: +Math.max(...steps).toFixed(1),
    zoom_draw_ms_median: +median(draws).toFixed(1),
    zoom_draw_ms_max: +Math.max(...draws).toFixed(1),
    // The frames that drew a zoom step: the display's interval, the longest one, and how many
    // lasted longer than one interval and a half (a frame missed).
    frame_interval_ms: +interval.toFixed(1),
    zoom_draw_frame_ms_max: +Math.max(...drawFrames).toFixed(1),
    zoom_frames_missed: missed,
    // Building every call site's series (once per filter, after the first draw).
    site_series_ms: Number.isNaN(siteSeriesMs) ? undefined : siteSeriesMs,
    wasm_memory_mib: +(wasmBytes / MiB).toFixed(0),
    js_heap_max_mib: +(heapMax / MiB).toFixed(1),
    memory_per_trace_byte: +((wasmBytes + heapMax) / bytes).toFixed(2),
  };
  console.log(JSON.stringify(out));
  await close();
}
