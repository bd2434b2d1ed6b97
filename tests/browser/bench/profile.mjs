// Profiling helper (not a test): opens one trace in the timeline, records a CPU profile of zoom
// steps (or, with LOAD=1, of opening the file) and prints the functions with the most self time.
// Each zoom step also prints its timings in ms from the key event: the synchronous handler
// (sync), the benchmark's animation frame (raf), the end of the draw (drawnAt), the draw itself
// (draw) and the next task after the frame (frame, what tests/browser/bench/bench.mjs reports).
// Env: BASE_URL (a served build), FILE (a trace), STEPS (default 12), LOAD.
import { launch } from '../lib.mjs';

const BASE = process.env.BASE_URL;
const FILE = process.env.FILE;
const LOAD = Boolean(process.env.LOAD);
const STEPS = LOAD ? 0 : Number(process.env.STEPS || 12);

const { ctx, close } = await launch();
const page = await ctx.newPage();
const cdp = await ctx.newCDPSession(page);
await page.goto(`${BASE}#view=timeline`);
await page.waitForSelector('[data-testid="file-picker"]', { state: 'attached' });
await cdp.send('Profiler.enable');
await cdp.send('Profiler.setSamplingInterval', { interval: LOAD ? 1000 : 100 });
if (LOAD) await cdp.send('Profiler.start');
await page.setInputFiles('[data-testid="file-picker"]', FILE);
await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-drawn-at]', { timeout: 600_000 });
if (!LOAD) {
  // Zoom steps after the detectors and the stacked call sites, as bench.mjs measures them.
  await page.waitForFunction(() => performance.getEntriesByName('gpucollect:analysed').length > 0, null, { timeout: 600_000 });
  await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-stacked="true"]', { timeout: 600_000 });
}
await page.waitForTimeout(500);
if (!LOAD) await cdp.send('Profiler.start');
for (let i = 0; i < STEPS; i++) {
  const r = await page.evaluate(async (key) => {
    const c = document.querySelector('[data-testid="timeline-canvas"]');
    const t0 = performance.now();
    window.dispatchEvent(new KeyboardEvent('keydown', { key, bubbles: true }));
    const sync = performance.now();
    let raf = 0;
    await new Promise((res) => requestAnimationFrame(() => { raf = performance.now(); setTimeout(res, 0); }));
    return { sync: sync - t0, raf: raf - t0, drawnAt: Number(c.dataset.drawnAt) - t0, draw: Number(c.dataset.drawMs), frame: performance.now() - t0 };
  }, i < STEPS / 2 ? '+' : '-');
  console.log(JSON.stringify(Object.fromEntries(Object.entries(r).map(([k, v]) => [k, +v.toFixed(1)]))));
}
const { profile } = await cdp.send('Profiler.stop');
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const self = new Map();
profile.samples.forEach((id, i) => {
  const n = byId.get(id);
  const name = `${n.callFrame.functionName || '(anonymous)'} ${n.callFrame.url.split('/').pop()}`;
  self.set(name, (self.get(name) || 0) + (profile.timeDeltas[i + 1] || 0));
});
const total = [...self.values()].reduce((a, b) => a + b, 0);
console.log(`total sampled ${(total / 1000).toFixed(0)} ms`);
for (const [k, v] of [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, 40)) {
  console.log(`${(v / 1000).toFixed(1).padStart(8)} ms  ${k}`);
}
await close();
