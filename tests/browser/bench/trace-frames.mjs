// Profiling helper (not a test): records a Chrome trace of zoom steps and prints, per thread,
// where the time goes (trace events by name, per step), then the canvas rasterization
// (ProduceCanvasResource, or FinalizeFrame when drawn outside an animation frame) and the
// animation-frame callbacks of each step.
// Env: BASE_URL (a served build), FILE (a trace), STEPS (default 12), CATS (trace categories).
import { launch } from '../lib.mjs';

const BASE = process.env.BASE_URL;
const FILE = process.env.FILE;
const STEPS = Number(process.env.STEPS || 12);
const CATS = process.env.CATS || 'devtools.timeline,disabled-by-default-devtools.timeline,blink,cc,viz,benchmark,toplevel';

const { ctx, close } = await launch();
const page = await ctx.newPage();
const cdp = await ctx.newCDPSession(page);
await page.goto(`${BASE}#view=timeline`);
await page.waitForSelector('[data-testid="file-picker"]', { state: 'attached' });
await page.setInputFiles('[data-testid="file-picker"]', FILE);
await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-drawn-at]', { timeout: 600_000 });
await page.waitForTimeout(500);
const events = [];
cdp.on('Tracing.dataCollected', (d) => events.push(...d.value));
const done = new Promise((res) => cdp.once('Tracing.tracingComplete', res));
await cdp.send('Tracing.start', { categories: CATS, transferMode: 'ReportEvents' });
for (let i = 0; i < STEPS; i++) {
  // The same step as tests/browser/bench/bench.mjs: a key, then the next frame.
  await page.evaluate(async (key) => {
    window.dispatchEvent(new KeyboardEvent('keydown', { key, bubbles: true }));
    await new Promise((res) => requestAnimationFrame(() => setTimeout(res, 0)));
  }, i < STEPS / 2 ? '+' : '-');
}
await cdp.send('Tracing.end');
await done;

const key = (e) => `${e.pid}:${e.tid}`;
const names = new Map(events.filter((e) => e.ph === 'M' && e.name === 'thread_name').map((e) => [key(e), e.args.name]));
const busy = new Map();
for (const e of events) if (e.ph === 'X' && e.name === 'RunTask') busy.set(key(e), (busy.get(key(e)) || 0) + e.dur);
const threads = [...busy.entries()].sort((a, b) => b[1] - a[1]).slice(0, 3);
for (const [tid] of threads) {
  const byName = new Map();
  for (const e of events) if (key(e) === tid && e.ph === 'X') byName.set(e.name, (byName.get(e.name) || 0) + e.dur);
  console.log(`\n== ${names.get(tid) || tid}`);
  for (const [k, v] of [...byName.entries()].sort((a, b) => b[1] - a[1]).slice(0, 20)) {
    console.log(`${(v / 1000 / STEPS).toFixed(2).padStart(8)} ms/step  ${k}`);
  }
}
const each = (n) => events.filter((e) => e.ph === 'X' && e.name === n).map((e) => (e.dur / 1000).toFixed(2)).join(' ');
console.log('\nProduceCanvasResource (ms):', each('Canvas2DResourceProviderSharedImage::ProduceCanvasResource'));
console.log('FinalizeFrame (ms):', each('CanvasRenderingContext2D::FinalizeFrame'));
console.log('FireAnimationFrame (ms):', each('FireAnimationFrame'));
await close();
