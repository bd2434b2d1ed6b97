// Profiling helper (not a test): records a Chrome trace while one file loads (from choosing it to
// the painted frame after the first drawn timeline) and prints the renderer main thread's time by top-level event
// (script, wasm compilation, style, layout, paint, GC, …) and the longest tasks in order.
// Env: BASE_URL (a served build), FILE, CATS (trace categories), COLD=1 (do not wait for the
// reading worker to run), EVENTS_OUT (a file for every event).
import { launch } from '../lib.mjs';

const CATS = process.env.CATS || 'devtools.timeline,disabled-by-default-devtools.timeline,blink,v8,v8.wasm,toplevel,disabled-by-default-v8.compile';
const { ctx, close } = await launch();
const page = await ctx.newPage();
const cdp = await ctx.newCDPSession(page);
await page.addInitScript(() => {
  document.addEventListener('change', () => { performance.mark('chosen'); }, true);
});
await page.goto(`${process.env.BASE_URL}#view=timeline`);
await page.waitForSelector('[data-testid="file-picker"]', { state: 'attached' });
// Once the reading worker runs (COLD=1: right away).
if (!process.env.COLD) await page.waitForFunction(() => performance.getEntriesByName('gpucollect:read-worker-ready').length > 0, null, { timeout: 60_000 });
await page.waitForTimeout(300);
const events = [];
cdp.on('Tracing.dataCollected', (d) => events.push(...d.value));
const done = new Promise((res) => cdp.once('Tracing.tracingComplete', res));
await cdp.send('Tracing.start', { categories: CATS, transferMode: 'ReportEvents' });
await page.setInputFiles('[data-testid="file-picker"]', process.env.FILE);
await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-drawn-at]', { timeout: 600_000 });
// Until the next frame has run too, so that the trace holds the whole frame that shows the
// timeline (its style, layout, paint and commit), the end point bench.mjs measures to.
await page.evaluate(() => new Promise((res) => requestAnimationFrame(() => setTimeout(res, 0))));
await cdp.send('Tracing.end');
await done;
await close();

// EVENTS_OUT: also writes every trace event there (JSON), for a closer look.
if (process.env.EVENTS_OUT) (await import('node:fs')).writeFileSync(process.env.EVENTS_OUT, JSON.stringify(events));
const names = new Map();
for (const e of events) if (e.name === 'thread_name') names.set(`${e.pid}:${e.tid}`, e.args.name);
// The page's renderer main thread: the busiest one (an idle renderer may exist too).
const busyness = new Map();
for (const e of events) if (e.ph === 'X' && e.dur) busyness.set(`${e.pid}:${e.tid}`, (busyness.get(`${e.pid}:${e.tid}`) || 0) + e.dur);
const mainKey = [...names].filter(([, n]) => n === 'CrRendererMain')
  .sort((a, b) => (busyness.get(b[0]) || 0) - (busyness.get(a[0]) || 0))[0]?.[0];
const main = events.filter((e) => `${e.pid}:${e.tid}` === mainKey && e.ph === 'X' && e.dur);
const chosen = events.find((e) => e.name === 'chosen' && `${e.pid}:${e.tid}` === mainKey)?.ts
  ?? Math.min(...main.map((e) => e.ts));
const end = Math.max(...main.map((e) => e.ts + e.dur));
// Top-level: events not inside another event of the main thread.
main.sort((a, b) => a.ts - b.ts || b.dur - a.dur);
const top = [];
let until = -1;
for (const e of main) {
  if (e.ts + e.dur <= until) continue;
  if (e.ts >= chosen) top.push(e);
  until = Math.max(until, e.ts + e.dur);
}
// Self time by name of every main-thread event (children subtracted), within the load.
const self = new Map();
const stack = [];
for (const e of main.filter((x) => x.ts >= chosen)) {
  while (stack.length && stack[stack.length - 1].ts + stack[stack.length - 1].dur <= e.ts) stack.pop();
  if (stack.length) { const p = stack[stack.length - 1]; self.set(p.name, (self.get(p.name) || 0) - e.dur); }
  self.set(e.name, (self.get(e.name) || 0) + e.dur);
  stack.push(e);
}
const busy = top.reduce((s, e) => s + e.dur, 0);
console.log(`load: ${((end - chosen) / 1000).toFixed(1)} ms, main thread busy ${(busy / 1000).toFixed(1)} ms`);
console.log('self time by event:');
for (const [n, us] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 20)) console.log((us / 1000).toFixed(1).padStart(9), 'ms', n);
console.log('top-level tasks over 2 ms (start after choosing, duration):');
for (const e of top.filter((x) => x.dur > 2000)) {
  console.log(((e.ts - chosen) / 1000).toFixed(1).padStart(9), (e.dur / 1000).toFixed(1).padStart(8), 'ms', e.name);
}
// Other threads' busy time within the load (compilers, file reading, GC helpers).
const byThread = new Map();
for (const e of events) {
  const k = `${e.pid}:${e.tid}`;
  if (k === mainKey || e.ph !== 'X' || !e.dur || e.ts < chosen || e.ts > end) continue;
  const n = names.get(k) || k;
  const m = byThread.get(n) || new Map();
  m.set(e.name, (m.get(e.name) || 0) + e.dur);
  byThread.set(n, m);
}
for (const [n, m] of byThread) {
  const topNames = [...m].sort((a, b) => b[1] - a[1]).slice(0, 4).map(([k, v]) => `${k} ${(v / 1000).toFixed(1)}`);
  console.log(`thread ${n}: ${topNames.join(', ')}`);
}
if (process.env.LAZY) {
  const lazy = main.filter((e) => e.name === 'wasm.CompileLazy' && e.ts >= chosen).sort((a, b) => b.dur - a.dur);
  for (const e of lazy.slice(0, Number(process.env.LAZY))) console.log('lazy', (e.dur / 1000).toFixed(2), JSON.stringify(e.args));
}
if (process.env.TOPTIER) {
  // Functions optimized (top tier) during the load, on any thread, by duration.
  const tt = events.filter((e) => e.name === 'wasm.TopTierCompilation' || e.name === 'wasm.CompileTopTier' || (e.name || '').includes('TopTier'))
    .filter((e) => e.ts >= chosen && e.ts <= end).sort((a, b) => (b.dur || 0) - (a.dur || 0));
  for (const e of tt.slice(0, Number(process.env.TOPTIER))) console.log('toptier', e.name, ((e.dur || 0) / 1000).toFixed(2), ((e.ts - chosen) / 1000).toFixed(1), JSON.stringify(e.args));
}
if (process.env.TIMELINE) {
  // Every main-thread top-level task and the worker's tasks, in order, over 0.5 ms.
  const wk = [...names].find(([, n]) => n === 'DedicatedWorker thread')?.[0];
  const rows = [...top.map((e) => ['main', e]), ...events.filter((e) => `${e.pid}:${e.tid}` === wk && e.ph === 'X' && e.dur > 500 && e.ts >= chosen && e.name === 'RunTask').map((e) => ['worker', e])];
  rows.sort((a, b) => a[1].ts - b[1].ts);
  for (const [w, e] of rows) if (e.dur > 500) console.log(w.padEnd(7), ((e.ts - chosen) / 1000).toFixed(1).padStart(8), (e.dur / 1000).toFixed(1).padStart(7), 'ms');
}
