// Profiles loading one file in headless Chromium (CDP sampling profiler) and prints the functions
// with the most self time. Not a test. Env: BASE_URL, FILE, CALLERS (a function name part: also
// prints the call paths into it, DEPTH frames deep (default 3), by time), COLD=1 (do not wait for
// the reading worker to run), TWICE=1 (then loads the file again in the same page and profiles that
// too: the second load runs in memory the first one already touched, so the difference is what
// first touches of memory cost).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { launch } from '../lib.mjs';
const { ctx, close } = await launch();
const page = await ctx.newPage();

const cdp = await ctx.newCDPSession(page);
await page.goto(`${process.env.BASE_URL}#view=timeline`);
await page.waitForSelector('[data-testid="file-picker"]', { state: 'attached' });
// Once the reading worker runs (COLD=1: right away).
if (!process.env.COLD) await page.waitForFunction(() => performance.getEntriesByName('gpucollect:read-worker-ready').length > 0, null, { timeout: 60_000 });
await cdp.send('Profiler.enable');
await cdp.send('Profiler.setSamplingInterval', { interval: 200 });
// The same file under a second name for TWICE (choosing the same path again changes nothing).
const again = process.env.TWICE
  ? path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'gpucollect-profile-')), `again-${path.basename(process.env.FILE)}`)
  : null;
if (again) fs.copyFileSync(process.env.FILE, again);
for (const [round, file] of (again ? [process.env.FILE, again] : [process.env.FILE]).entries()) {
await cdp.send('Profiler.start');
const t0 = Date.now();
await page.setInputFiles('[data-testid="file-picker"]', file);
await page.waitForFunction((n) => document.querySelector('canvas[data-testid="timeline-canvas"][data-drawn-at]')
  && performance.getEntriesByName('gpucollect:tables').length > n, round, { timeout: 600_000 });
const { profile } = await cdp.send('Profiler.stop');
if (process.env.TWICE) console.log(`load ${round + 1}: ${Date.now() - t0} ms (wall clock, with the profiler)`);
const self = new Map();
const dt = new Map();
for (let i = 0; i < profile.samples.length; i++) dt.set(i, profile.timeDeltas[i] || 0);
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const counts = new Map();
profile.samples.forEach((id, i) => counts.set(id, (counts.get(id) || 0) + (profile.timeDeltas[i] || 0)));
for (const [id, us] of counts) {
  const n = byId.get(id);
  const name = `${n.callFrame.functionName || '(anon)'} ${n.callFrame.url.split('/').pop()}`;
  self.set(name, (self.get(name) || 0) + us);
}
const top = [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, 30);
for (const [name, us] of top) console.log((us / 1000).toFixed(1).padStart(8), 'ms', name.slice(0, 150));
if (process.env.CALLERS) {
  const parent = new Map();
  for (const n of profile.nodes) for (const c of n.children || []) parent.set(c, n.id);
  const paths = new Map();
  for (const [id, us] of counts) {
    if (!byId.get(id).callFrame.functionName.includes(process.env.CALLERS)) continue;
    const names = [];
    for (let p = parent.get(id); p !== undefined && names.length < Number(process.env.DEPTH || 3); p = parent.get(p)) {
      names.push(byId.get(p).callFrame.functionName.replace(/::h[0-9a-f]{16}$/, '').slice(-70));
    }
    const k = names.join(' <- ');
    paths.set(k, (paths.get(k) || 0) + us);
  }
  console.log(`callers of ${process.env.CALLERS}:`);
  for (const [k, us] of [...paths].sort((a, b) => b[1] - a[1]).slice(0, 12)) console.log((us / 1000).toFixed(1).padStart(8), 'ms', k);
}
if (process.env.TWICE) await page.waitForTimeout(1500);
}
if (again) fs.rmSync(path.dirname(again), { recursive: true, force: true });
await close();
