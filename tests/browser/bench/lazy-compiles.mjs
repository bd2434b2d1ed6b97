// Profiling helper (not a test): which WebAssembly functions the browser compiles lazily (on
// their first call, on the main thread) during the first real load, after the page's warm-up.
// Traces the whole page from its start, so each function is seen once: compiled during the
// warm-up, or only during the load (code the warm-up does not reach, e.g. a copy of the loading
// code made for another caller). Prints the counts and time, and with LIST=N the N slowest
// compiled before the first tables. Env: BASE_URL (a served build), FILE, WASM (the build's
// .wasm file, for function names), LIST.
import fs from 'node:fs';
import { launch } from '../lib.mjs';

// Function index -> name, from the wasm file's name section.
function wasmNames(file) {
  const b = fs.readFileSync(file);
  let p = 8;
  const leb = () => { let r = 0, s = 0, x; do { x = b[p++]; r += (x & 0x7f) * 2 ** s; s += 7; } while (x & 0x80); return r; };
  const names = new Map();
  while (p < b.length) {
    const id = b[p++]; const len = leb(); const end = p + len;
    if (id === 0) {
      const nl = leb(); const nm = b.subarray(p, p + nl).toString(); p += nl;
      while (nm === 'name' && p < end) {
        const sid = b[p++]; const sl = leb(); const se = p + sl;
        if (sid === 1) for (let n = leb(), i = 0; i < n; i++) { const idx = leb(); const l = leb(); names.set(idx, b.subarray(p, p + l).toString()); p += l; }
        p = se;
      }
    }
    p = end;
  }
  return names;
}
const names = process.env.WASM ? wasmNames(process.env.WASM) : new Map();
const { ctx, close } = await launch();
const page = await ctx.newPage();
const cdp = await ctx.newCDPSession(page);
const events = [];
cdp.on('Tracing.dataCollected', (d) => events.push(...d.value));
const done = new Promise((res) => cdp.once('Tracing.tracingComplete', res));
await cdp.send('Tracing.start', { categories: 'v8.wasm,blink.user_timing', transferMode: 'ReportEvents' });
await page.goto(`${process.env.BASE_URL}#view=timeline`);
await page.waitForSelector('html[data-warm="done"]', { state: 'attached', timeout: 60_000 });
const warmLoads = await page.evaluate(() => { performance.mark('warm-done-seen'); return performance.getEntriesByName('gpucollect:tables').length; });
await page.waitForTimeout(300);
await page.setInputFiles('[data-testid="file-picker"]', process.env.FILE);
await page.waitForFunction((n) => performance.getEntriesByName('gpucollect:tables').length > n, warmLoads);
await cdp.send('Tracing.end');
await done;
await close();
const warm = events.find((e) => e.name === 'warm-done-seen')?.ts;
const tables = Math.max(...events.filter((e) => e.name === 'gpucollect:tables').map((e) => e.ts));
const lazy = events.filter((e) => e.name === 'wasm.CompileLazy');
const before = lazy.filter((e) => e.ts < warm);
const load = lazy.filter((e) => e.ts >= warm && e.ts <= tables);
const ms = (l) => (l.reduce((s, e) => s + e.dur, 0) / 1000).toFixed(2);
console.log(`compiled lazily: ${before.length} functions during the warm-up (${ms(before)} ms), ${load.length} during the load until its tables (${ms(load)} ms)`);
for (const e of load.sort((a, b) => b.dur - a.dur).slice(0, Number(process.env.LIST || 0))) {
  console.log(`${String(e.dur).padStart(6)} µs  ${names.get(e.args.func_index) ?? e.args.func_index}`);
}
