// Profiling helper (not a test; Linux only): loads FILE in the served viewer (BASE_URL) once the
// reading worker runs and prints, for each Chromium process, and each thread of the renderer, the
// minor page faults (memory touched for the first time: each costs the kernel a fresh zeroed
// page) and the CPU ticks (user, system; 10 ms each) taken from choosing the file to the drawn
// timeline, read from /proc. `wall` includes the harness's round trips.
import fs from 'node:fs';
import { launch } from '../lib.mjs';
function faults() {
  const out = {};
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      if (!cmd.includes('chromium')) continue;
      const type = (cmd.match(/--type=([a-z-]+)/) || [, 'browser'])[1];
      const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
      out[pid] = { type, minflt: Number(st[7]), utime: Number(st[11]), stime: Number(st[12]) };
      if (type === 'renderer') for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
        const c = fs.readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
        const t = fs.readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8').split(') ')[1].split(' ');
        out[`${pid}/${tid}`] = { type: `  thread ${c}`, minflt: Number(t[7]), utime: Number(t[11]), stime: Number(t[12]) };
      }
    } catch {}
  }
  return out;
}
const { ctx, close } = await launch();
const page = await ctx.newPage();
await page.goto(`${process.env.BASE_URL}#view=timeline`);
await page.waitForFunction(() => performance.getEntriesByName('gpucollect:read-worker-ready').length > 0, null, { timeout: 60_000 });
await page.waitForTimeout(500);
const a = faults();
const t0 = Date.now();
await page.setInputFiles('[data-testid="file-picker"]', process.env.FILE);
await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-drawn-at]', { timeout: 600_000 });
const ms = Date.now() - t0;
const b = faults();
for (const pid of Object.keys(b)) {
  if (!a[pid]) continue;
  const d = b[pid].minflt - a[pid].minflt;
  const cpu = (b[pid].utime + b[pid].stime) - (a[pid].utime + a[pid].stime);
  if (d > 100 || cpu > 1) console.log(b[pid].type, pid, 'minflt', d, `(${(d * 4 / 1024).toFixed(0)} MiB)`, 'cpu ticks', b[pid].utime - a[pid].utime, b[pid].stime - a[pid].stime);
}
console.log('wall', ms);
await close();
