// Runs the browser specs (tests/browser/specs/<view>.spec.mjs) in one headless Chromium.
// Called by scripts/test-browser.sh, which builds the app, writes the traces and their reports,
// and serves them (see harness.mjs for the environment).
// Choose: `node run.mjs leaks timeline` (or SPEC="leaks timeline") runs those specs only;
// ONLY=text runs the tests whose name contains it.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { ARTIFACTS, BASE, TRACES } from './harness.mjs';
import { launch } from './lib.mjs';

if (!BASE || !TRACES) {
  console.error('set BASE_URL and TRACES (scripts/test-browser.sh does)');
  process.exit(2);
}
fs.mkdirSync(ARTIFACTS, { recursive: true });
const dir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'specs');
const all = fs.readdirSync(dir).filter((f) => f.endsWith('.spec.mjs')).sort().map((f) => f.replace(/\.spec\.mjs$/, ''));
const asked = [...process.argv.slice(2), ...(process.env.SPEC || '').split(/[\s,]+/)].filter(Boolean);
const unknown = asked.filter((s) => !all.includes(s));
if (unknown.length) {
  console.error(`no spec named ${unknown.join(', ')}; specs: ${all.join(', ')}`);
  process.exit(2);
}
const specs = asked.length ? all.filter((s) => asked.includes(s)) : all;

const { ctx, close } = await launch();
let passed = 0;
let failed = 0;
for (const name of specs) {
  const { default: tests } = await import(pathToFileURL(path.join(dir, `${name}.spec.mjs`)));
  for (const [i, t] of tests.entries()) {
    if (process.env.ONLY && !t.name.includes(process.env.ONLY)) continue;
    const started = Date.now();
    try {
      await t.fn(ctx);
      passed++;
      console.log(`ok   ${name}: ${t.name} (${Date.now() - started} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${t.name}\n     ${String(e.stack || e).split('\n').slice(0, 6).join('\n     ')}`);
      for (const [j, p] of ctx.pages().entries()) {
        await p.screenshot({ path: path.join(ARTIFACTS, `failure-${name}-${i}-${j}.png`), fullPage: true }).catch(() => {});
      }
    }
    for (const p of ctx.pages()) await p.close().catch(() => {});
  }
}
await close();
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed || !passed ? 1 : 0);
