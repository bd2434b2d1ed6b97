// What every spec shares: the environment scripts/test-browser.sh sets up, the reports it wrote
// (`gpucollect report --format json`, the expected values), and the way a spec declares tests.
// Env: BASE_URL (the served app, with the traces under /traces/), TRACES (the same traces on
// disk), ARTIFACTS (screenshots), SERVE_URL (a `gpucollect serve` with a store).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const BASE = process.env.BASE_URL;
export const TRACES = process.env.TRACES;
export const SERVE_URL = process.env.SERVE_URL;
export const ARTIFACTS = process.env.ARTIFACTS || 'test-artifacts';
/** How long a load may take before a wait fails (a debug build on a busy machine). */
export const LOAD_TIMEOUT = 60_000;

/** `gpucollect report --format json` of `TRACES/<name>.msgpack` (or the file of that name). */
export const report = (name) => JSON.parse(fs.readFileSync(path.join(TRACES, `${name}.json`), 'utf8'));
/** A trace's bytes, to drop on the page. */
export const traceBytes = (file) => fs.readFileSync(path.join(TRACES, file));
/** A trace's path on disk, for the file dialog. */
export const tracePath = (file) => path.join(TRACES, file);
/** Where a screenshot named `name` goes. */
export const artifact = (name) => path.join(ARTIFACTS, name);

/** A spec's test list and the function that adds to it: `const { tests, test } = spec();`,
 * `test('name', async (ctx) => { ... })`, `export default tests`. */
export function spec() {
  const tests = [];
  return { tests, test: (name, fn) => tests.push({ name, fn }) };
}

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
/** The gpucollect binary scripts/test-browser.sh built. */
export const GPUCOLLECT = process.env.GPUCOLLECT || path.join(ROOT, 'target/debug/gpucollect');

/** Starts another `gpucollect serve` of the built viewer (dist/) on a free loopback port, with
 * an empty store and the extra `args`; returns `{ url, stop }`. */
export async function startServe(args = []) {
  const store = fs.mkdtempSync(path.join(os.tmpdir(), 'gpucollect-serve-'));
  const child = spawn(GPUCOLLECT, ['serve', '--addr', '127.0.0.1:0', '--assets', path.join(ROOT, 'dist'),
    '--store', store, '--demo-events', '1000', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`gpucollect serve did not start: ${log}`)), LOAD_TIMEOUT);
    child.stderr.on('data', (d) => {
      log += d;
      // The whole URL: a chunk may end inside it.
      const m = /listening on (http:\/\/[^\s/]+\/)/.exec(log);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`gpucollect serve exited (${code}): ${log}`)); });
  });
  return {
    url,
    stop: () => { child.kill(); fs.rmSync(store, { recursive: true, force: true }); },
  };
}
