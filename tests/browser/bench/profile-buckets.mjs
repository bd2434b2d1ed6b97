// Profiling helper (not a test): samples one load (as profile-load.mjs does) and prints, for each
// BUCKET_MS (default 10) of the load, the functions with the most self time in it. Env: BASE_URL,
// FILE, BUCKET_MS, TOP (functions per bucket, default 4).
import { launch } from '../lib.mjs';
const { ctx, close } = await launch();
const page = await ctx.newPage();
const cdp = await ctx.newCDPSession(page);
await page.goto(`${process.env.BASE_URL}#view=timeline`);
await page.waitForSelector('[data-testid="file-picker"]', { state: 'attached' });
await page.waitForFunction(() => performance.getEntriesByName('gpucollect:read-worker-ready').length > 0, null, { timeout: 60_000 });
await cdp.send('Profiler.enable');
await cdp.send('Profiler.setSamplingInterval', { interval: 100 });
await cdp.send('Profiler.start');
await page.setInputFiles('[data-testid="file-picker"]', process.env.FILE);
await page.waitForFunction(() => document.querySelector('canvas[data-testid="timeline-canvas"][data-drawn-at]')
  && performance.getEntriesByName('gpucollect:tables').length > 0, null, { timeout: 600_000 });
const { profile } = await cdp.send('Profiler.stop');
await close();
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const bucket = Number(process.env.BUCKET_MS || 10) * 1000;
const top = Number(process.env.TOP || 4);
// The load starts at the first sample that is not idle.
let t = profile.startTime;
const rows = [];
profile.samples.forEach((id, i) => {
  t += profile.timeDeltas[i] || 0;
  const n = byId.get(id).callFrame;
  rows.push([t, `${n.functionName || '(anon)'}`.replace(/::h[0-9a-f]{16}$/, '').slice(-60), profile.timeDeltas[i + 1] || 0]);
});
const start = rows.find((r) => r[1] !== '(idle)' && r[1] !== '(program)')?.[0] ?? profile.startTime;
const buckets = new Map();
for (const [ts, name, dt] of rows) {
  if (ts < start) continue;
  const k = Math.floor((ts - start) / bucket);
  const m = buckets.get(k) || new Map();
  m.set(name, (m.get(name) || 0) + dt);
  buckets.set(k, m);
}
for (const [k, m] of [...buckets].sort((a, b) => a[0] - b[0])) {
  const s = [...m].sort((a, b) => b[1] - a[1]).slice(0, top).map(([n, us]) => `${(us / 1000).toFixed(1)} ${n}`);
  console.log(`${String(k * bucket / 1000).padStart(5)} ms: ${s.join(' | ')}`);
}
